"""drivebench: train small autonomous-driving perception models and measure where the time goes."""

__version__ = "0.1.0"
