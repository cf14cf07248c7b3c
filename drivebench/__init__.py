"""drivebench: train small autonomous-driving perception models and measure where the time goes."""

from drivebench.resolvers import register as _register_resolvers
from drivebench.schemas import register as _register_schemas

__version__ = "0.1.0"
_register_resolvers()  # ${on_gpu:...} in conf/
_register_schemas()    # the typed config groups (drivebench/schemas.py) in Hydra's ConfigStore
