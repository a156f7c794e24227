"""CSI over gRPC: generated bindings, connection handling, CSI-backed provisioner and attacher."""

__all__: list[str] = []  # nothing is re-exported here; the API lives in the subpackages
