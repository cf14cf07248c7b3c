"""The 13 nuScenes tables and the CAN bus expansion files of the embedded set.

Field names, token chains and value conventions follow the real v1.0 files (see
/work/shared/reference/datasets.md): quaternions [w, x, y, z] sensor->ego and ego->global,
integer microsecond timestamps, "" at chain ends, sweeps pointing at the next key frame.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from drivebench.data.nuscenes.maps import make_token
from drivebench.data.nuscenes.world import Scene, yaw_quaternion

TABLES = ("attribute", "calibrated_sensor", "category", "ego_pose", "instance", "log", "map", "sample",
          "sample_annotation", "sample_data", "scene", "sensor", "visibility")

CATEGORIES = (
    ("human.pedestrian.adult", "Adult subcategory."),
    ("human.pedestrian.child", "Child subcategory."),
    ("human.pedestrian.wheelchair", "Wheelchairs."),
    ("human.pedestrian.stroller", "Strollers."),
    ("human.pedestrian.personal_mobility", "A small electric or self-propelled vehicle."),
    ("human.pedestrian.police_officer", "Police officer."),
    ("human.pedestrian.construction_worker", "Construction worker."),
    ("animal", "All animals."),
    ("vehicle.car", "Vehicle designed primarily for personal use."),
    ("vehicle.motorcycle", "Gasoline or electric powered 2-wheeled vehicle."),
    ("vehicle.bicycle", "Human or electric powered 2-wheeled vehicle."),
    ("vehicle.bus.bendy", "Bendy bus subcategory."),
    ("vehicle.bus.rigid", "Rigid bus subcategory."),
    ("vehicle.truck", "Vehicles primarily designed to haul cargo."),
    ("vehicle.construction", "Vehicles primarily designed for construction."),
    ("vehicle.emergency.ambulance", "All types of ambulances."),
    ("vehicle.emergency.police", "All types of police vehicles."),
    ("vehicle.trailer", "Any vehicle trailer."),
    ("movable_object.barrier", "Temporary road barrier placed in the scene."),
    ("movable_object.trafficcone", "All types of traffic cone."),
    ("movable_object.pushable_pullable", "Objects that a pedestrian may push or pull."),
    ("movable_object.debris", "Movable object that is left on the driveable surface."),
    ("static_object.bicycle_rack", "Area or device intended to park or secure the bicycles."),
)
ATTRIBUTES = (
    ("vehicle.moving", "Vehicle is moving."),
    ("vehicle.stopped", "Vehicle, with a driver/rider in/on it, is currently stationary but has an intent to move."),
    ("vehicle.parked", "Vehicle is stationary (usually for longer duration) with no immediate intent to move."),
    ("cycle.with_rider", "There is a rider on the bicycle or motorcycle."),
    ("cycle.without_rider", "There is NO rider on the bicycle or motorcycle."),
    ("pedestrian.sitting_lying_down", "The human is sitting or lying down."),
    ("pedestrian.standing", "The human is standing."),
    ("pedestrian.moving", "The human is moving."),
)
VISIBILITY = (("1", "v0-40"), ("2", "v40-60"), ("3", "v60-80"), ("4", "v80-100"))
SENSORS = (("CAM_FRONT", "camera"), ("CAM_FRONT_RIGHT", "camera"), ("CAM_FRONT_LEFT", "camera"),
           ("CAM_BACK", "camera"), ("CAM_BACK_LEFT", "camera"), ("CAM_BACK_RIGHT", "camera"), ("LIDAR_TOP", "lidar"))


def category_token(name: str) -> str:
    return make_token("category", name)


def attribute_token(name: str) -> str:
    return make_token("attribute", name)


def sensor_token(channel: str) -> str:
    return make_token("sensor", channel)


def static_tables() -> dict[str, list[dict]]:
    return {
        "category": [{"token": category_token(n), "name": n, "description": d} for n, d in CATEGORIES],
        "attribute": [{"token": attribute_token(n), "name": n, "description": d} for n, d in ATTRIBUTES],
        "visibility": [{"token": t, "level": lvl, "description": f"visibility of whole object is {lvl[1:]}%"}
                       for t, lvl in VISIBILITY],
        "sensor": [{"token": sensor_token(c), "channel": c, "modality": m} for c, m in SENSORS],
    }


def visibility_token(num_pts: int, box: np.ndarray, distance: float) -> str:
    """Visible fraction estimated from LiDAR returns against those of an unoccluded box."""
    w, l, h = box[3], box[4], box[5]
    solid_angle_per_ray = (2 * math.pi / 1084) * math.radians(41.3 / 31)
    expected = max(1.0, max(w, l) * min(h, 3.0) / max(distance, 1.0) ** 2 / solid_angle_per_ray)
    ratio = num_pts / expected
    return "4" if ratio >= 0.8 else "3" if ratio >= 0.6 else "2" if ratio >= 0.4 else "1"


def write_table(table_dir: Path, name: str, rows: list[dict]) -> None:
    tmp = table_dir / f".{name}.json.tmp"
    tmp.write_text(json.dumps(rows, indent=0, separators=(",", ":")))
    tmp.replace(table_dir / f"{name}.json")


def _r(v, nd: int = 6) -> list[float]:
    return [round(float(x), nd) for x in v]


def can_bus_messages(scene: Scene, end_us: int) -> dict[str, object]:
    """CAN bus expansion messages of one scene, from the ego's continuous motion."""
    t0 = scene.start_us - 1_000_000
    t1 = end_us + 1_000_000

    def kinematics(hz: float):
        ut = np.arange(t0, t1, int(1e6 / hz), dtype=np.int64)
        t = scene.t(ut)
        s = scene.ego.distance(t)
        xy = scene.ego.path.position(s)
        yaw = scene.ego.path.heading(s)
        v = scene.ego.speed(t)
        a = scene.ego.accel(t)
        kappa = scene.ego.path.curvature(s)
        return ut, xy, yaw, v, a, kappa

    ut, xy, yaw, v, a, kappa = kinematics(50)
    pose = [
        {"accel": _r([a[i], v[i] ** 2 * kappa[i], 9.81]), "orientation": _r(yaw_quaternion(float(yaw[i]))),
         "pos": _r([xy[i, 0], xy[i, 1], 0.0]), "rotation_rate": _r([0.0, 0.0, v[i] * kappa[i]]),
         "utime": int(ut[i]), "vel": _r([v[i], 0.0, 0.0])}
        for i in range(len(ut))
    ]
    ut100, _, _, v100, a100, k100 = kinematics(100)
    wheelbase, steer_ratio = 2.588, 15.0
    steer = np.arctan(wheelbase * k100) * steer_ratio
    steer_msgs = [{"utime": int(u), "value": round(float(x), 5)} for u, x in zip(ut100, steer)]
    imu = [{"linear_accel": _r([a100[i], v100[i] ** 2 * k100[i], 9.81]), "q": _r(yaw_quaternion(0.0)),
            "rotation_rate": _r([0.0, 0.0, v100[i] * k100[i]]), "utime": int(ut100[i])} for i in range(len(ut100))]
    wheel_rpm = v100 / 0.3 * 60 / (2 * math.pi)
    zoe_info = [{"FL_wheel_speed": round(float(wheel_rpm[i]), 3), "FR_wheel_speed": round(float(wheel_rpm[i]), 3),
                 "RL_wheel_speed": round(float(wheel_rpm[i]), 3), "RR_wheel_speed": round(float(wheel_rpm[i]), 3),
                 "left_solar": 0, "longitudinal_accel": round(float(a100[i]), 4), "meanEffTorque": 0,
                 "odom": 0, "odom_speed": round(float(v100[i] * 3.6), 3), "pedal_cc": 0, "regen": 0,
                 "requestedTorqueAfterProc": 0, "right_solar": 0, "steer_corrected": round(float(steer[i]), 4),
                 "steer_offset_can": 0, "steer_raw": round(float(steer[i]), 4),
                 "transversal_accel": round(float(v100[i] ** 2 * k100[i]), 4), "utime": int(ut100[i])}
                for i in range(len(ut100))]
    zoe_sensors = [{"brake_sensor": 0.15, "steering_sensor": round(float(steer[i]), 4),
                    "throttle_sensor": round(float(max(a100[i], 0.0) * 0.1 + 0.2), 4), "utime": int(ut100[i])}
                   for i in range(0, len(ut100), 2)]
    ut2 = ut100[::50]
    monitor = [{"available_distance": 140, "battery_level": 80, "brake": 0, "brake_switch": 1, "gear_position": 7,
                "left_signal": 0, "rear_left_rpm": round(float(wheel_rpm[i * 50]), 2),
                "rear_right_rpm": round(float(wheel_rpm[i * 50]), 2), "right_signal": 0,
                "steering": round(float(steer[i * 50]), 3), "steering_speed": 0, "throttle": 10,
                "utime": int(u), "vehicle_speed": round(float(v100[i * 50] * 3.6), 3),
                "yaw_rate": round(float(v100[i * 50] * k100[i * 50]), 4)} for i, u in enumerate(ut2)]
    route_s = np.arange(scene.ego.s0 - 20.0, min(scene.ego.path.length, scene.ego.s0 + 400.0), 5.0)
    route = scene.ego.path.position(route_s).round(3).tolist()
    messages: dict[str, object] = {"pose": pose, "steeranglefeedback": steer_msgs, "ms_imu": imu,
                                   "zoe_veh_info": zoe_info, "zoesensors": zoe_sensors, "vehicle_monitor": monitor,
                                   "route": route}
    meta = {}
    for name, msgs in messages.items():
        if name == "route":
            continue
        utimes = [m["utime"] for m in msgs]  # type: ignore[index]
        meta[name] = {"message_count": len(msgs), "message_freq": round(len(msgs) / ((utimes[-1] - utimes[0]) * 1e-6), 2),
                      "first_utime": utimes[0], "last_utime": utimes[-1]}
    messages["meta"] = meta
    return messages


def write_can_bus(root: Path, scene: Scene, end_us: int) -> None:
    can_dir = root / "can_bus"
    can_dir.mkdir(parents=True, exist_ok=True)
    for name, msgs in can_bus_messages(scene, end_us).items():
        (can_dir / f"{scene.name}_{name}.json").write_text(json.dumps(msgs, separators=(",", ":")))
