"""client-go's controller machinery rebuilt for asyncio: REST access, informers, work queues,
events, leader election and client configuration. It knows nothing about storage."""

from pyprovlib.kube.clock import Clock, FakeClock, RealClock
from pyprovlib.kube.resources import RESOURCES, Resource, resource_for

__all__ = ["RESOURCES", "Clock", "FakeClock", "RealClock", "Resource", "resource_for"]
