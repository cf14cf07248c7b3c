#!/usr/bin/env bash
# GPU benchmark, part 10: part 9 again without its loader runs (done there), the doctor with a longer
# cap (60 s cut it during its cold CPU compile smoke test) and `packaging` carried in .whl/mm for the
# build tools (scripts/device/openmmlab_wheels.sh fetches it now).
SKIP_LOADERS=1 DOCTOR_CAP=170 LIMIT=${LIMIT:-555} exec bash scripts/device/bench9.sh
