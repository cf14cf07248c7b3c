"""The Argoverse 2 vocabulary sizes and time layout QCNet's embeddings and graphs depend on.

Derived from ``drivebench.data.argoverse2.schema`` (the owner of the codes, which follow upstream
QCNet's AV2 processing entry for entry), so the model and the loader cannot disagree.
"""

from __future__ import annotations

from drivebench.data.argoverse2 import schema

NUM_AGENT_TYPES = len(schema.AGENT_TYPES)  # 10
NUM_POLYGON_TYPES = len(schema.POLYGON_TYPES)  # 4
NUM_INTERSECTION_VALUES = len(schema.POLYGON_IS_INTERSECTION)  # 3: True, False, unknown
NUM_POINT_TYPES = len(schema.POINT_TYPES)  # 17
NUM_POINT_SIDES = len(schema.POINT_SIDES)  # 3
NUM_PL2PL_TYPES = len(schema.POLYGON_TO_POLYGON_TYPES)  # 5: NONE (radius only), PRED, SUCC, LEFT, RIGHT

NUM_HISTORICAL_STEPS = schema.NUM_HISTORICAL_STEPS  # 50 (5 s at 10 Hz)
NUM_FUTURE_STEPS = schema.NUM_FUTURE_STEPS  # 60
STEP_SECONDS = schema.STEP_SECONDS

FOCAL_CATEGORY = schema.AGENT_CATEGORIES.index("focal")  # 3: upstream's validation eval_mask
SCORED_CATEGORY = schema.AGENT_CATEGORIES.index("scored")  # 2
