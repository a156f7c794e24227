"""Process concerns shared by every entry point: flags, logging, HTTP endpoints, signals."""
