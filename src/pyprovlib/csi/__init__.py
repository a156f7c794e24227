"""CSI over gRPC: generated bindings, connection handling, CSI-backed provisioner and attacher."""
