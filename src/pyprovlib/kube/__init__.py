"""client-go's controller machinery rebuilt for asyncio: REST access, informers, work queues,
events, leader election and client configuration. It knows nothing about storage.

Everything public is imported from this package; its modules (``_informer``, ``_workqueue``,
...) are internal. Objects are plain JSON dicts (:data:`Obj`), as the API server sends them.
"""

from pyprovlib.kube._clock import Clock, FakeClock, RealClock
from pyprovlib.kube._config import ClientSettings, ConfigError, new_client
from pyprovlib.kube._errors import is_already_exists, is_conflict, is_not_found
from pyprovlib.kube._events import EventRecorder
from pyprovlib.kube._informer import (
    SharedInformer,
    SharedInformerFactory,
    TransformFunc,
    strip_managed_fields,
)
from pyprovlib.kube._leaderelection import LeaderElectionConfig, LeaderElector
from pyprovlib.kube._objects import Obj, meta_namespace_key, split_key
from pyprovlib.kube._quantity import Quantity, parse_quantity
from pyprovlib.kube._resources import (
    EVENTS,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    STORAGE_CLASSES,
    Resource,
    resource_for,
)
from pyprovlib.kube._rest import ResourceClient, WatchExpiredError
from pyprovlib.kube._store import DeletedFinalStateUnknown, Indexer, Store
from pyprovlib.kube._workqueue import (
    BucketRateLimiter,
    DelayingQueue,
    ItemExponentialFailureRateLimiter,
    ItemFastSlowRateLimiter,
    MaxOfRateLimiter,
    RateLimiter,
    RateLimitingQueue,
    ShutDownError,
    WorkQueue,
    default_controller_rate_limiter,
)

__all__ = [
    "EVENTS",
    "NODES",
    "PERSISTENT_VOLUMES",
    "PERSISTENT_VOLUME_CLAIMS",
    "STORAGE_CLASSES",
    "BucketRateLimiter",
    "ClientSettings",
    "Clock",
    "ConfigError",
    "DelayingQueue",
    "DeletedFinalStateUnknown",
    "EventRecorder",
    "FakeClock",
    "Indexer",
    "ItemExponentialFailureRateLimiter",
    "ItemFastSlowRateLimiter",
    "LeaderElectionConfig",
    "LeaderElector",
    "MaxOfRateLimiter",
    "Obj",
    "Quantity",
    "RateLimiter",
    "RateLimitingQueue",
    "RealClock",
    "Resource",
    "ResourceClient",
    "SharedInformer",
    "SharedInformerFactory",
    "ShutDownError",
    "Store",
    "TransformFunc",
    "WatchExpiredError",
    "WorkQueue",
    "default_controller_rate_limiter",
    "is_already_exists",
    "is_conflict",
    "is_not_found",
    "meta_namespace_key",
    "new_client",
    "parse_quantity",
    "resource_for",
    "split_key",
    "strip_managed_fields",
]
