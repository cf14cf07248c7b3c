"""drivebench: train small autonomous-driving perception models and measure where the time goes."""

from drivebench.resolvers import register as _register_resolvers

__version__ = "0.1.0"
_register_resolvers()
