"""client-go's controller machinery rebuilt for asyncio: REST access, informers, work queues,
events, leader election and client configuration. It knows nothing about storage."""

from pyprovlib.kube.clock import Clock, FakeClock, RealClock
from pyprovlib.kube.config import ClientSettings, ConfigError, new_client
from pyprovlib.kube.events import EventRecorder
from pyprovlib.kube.informer import (
    SharedInformer,
    SharedInformerFactory,
    TransformFunc,
    strip_managed_fields,
)
from pyprovlib.kube.leaderelection import LeaderElectionConfig, LeaderElector
from pyprovlib.kube.quantity import Quantity, parse_quantity
from pyprovlib.kube.resources import RESOURCES, Resource, resource_for
from pyprovlib.kube.rest import ResourceClient, WatchExpiredError
from pyprovlib.kube.store import DeletedFinalStateUnknown, Indexer, Store
from pyprovlib.kube.workqueue import (
    DelayingQueue,
    RateLimitingQueue,
    ShutDownError,
    WorkQueue,
    default_controller_rate_limiter,
)

__all__ = [
    "RESOURCES",
    "ClientSettings",
    "Clock",
    "ConfigError",
    "DelayingQueue",
    "DeletedFinalStateUnknown",
    "EventRecorder",
    "FakeClock",
    "Indexer",
    "LeaderElectionConfig",
    "LeaderElector",
    "Quantity",
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
    "new_client",
    "parse_quantity",
    "resource_for",
    "strip_managed_fields",
]
