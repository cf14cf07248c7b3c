"""Scenes of the embedded set: the sensor rig, the ego route, the other agents and their motion.

Everything is a deterministic function of (seed, scene index), so any process can rebuild a scene
and render or ray-cast any instant of it. Motion is continuous in time: each sensor sample uses the
poses at its own timestamp, as in the real data (cameras fire up to ~25 ms off the LiDAR).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from pyquaternion import Quaternion

from drivebench.data.nuscenes import CAMERAS
from drivebench.data.nuscenes.maps import CityMap, make_token

LIDAR_TRANSLATION = np.array([0.943713, 0.0, 1.84023])
LIDAR_YAW_DEG = -90.0
# yaw (deg, counter-clockwise from ego x), translation (ego frame), fx, cx, cy at 1600x900
CAMERA_RIG: dict[str, tuple[float, tuple[float, float, float], float, float, float]] = {
    "CAM_FRONT": (0.0, (1.700, 0.016, 1.511), 1266.4, 816.3, 491.5),
    "CAM_FRONT_RIGHT": (-55.0, (1.551, -0.493, 1.496), 1260.8, 808.0, 495.3),
    "CAM_FRONT_LEFT": (55.0, (1.524, 0.495, 1.509), 1272.6, 826.6, 479.8),
    "CAM_BACK": (180.0, (0.028, 0.003, 1.579), 809.2, 829.2, 481.8),
    "CAM_BACK_LEFT": (110.0, (1.036, 0.485, 1.591), 1256.7, 792.1, 492.8),
    "CAM_BACK_RIGHT": (-110.0, (1.015, -0.481, 1.562), 1259.5, 807.3, 501.2),
}
# camera trigger time relative to the LiDAR key frame (the LiDAR sweeps past each camera in turn)
CAMERA_OFFSET_US = {"CAM_FRONT": -24000, "CAM_FRONT_RIGHT": -16000, "CAM_BACK_RIGHT": -4000, "CAM_BACK": 1000,
                    "CAM_BACK_LEFT": 9000, "CAM_FRONT_LEFT": 20000}
NATIVE_SIZE = (1600, 900)
ANNOTATION_RANGE = 50.0
KEYFRAME_US = 500_000


def yaw_quaternion(yaw: float) -> list[float]:
    return [math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)]


def matrix_to_quat(m: np.ndarray) -> list[float]:
    return [float(v) for v in Quaternion(matrix=m, rtol=1e-6, atol=1e-6).q]


def transform(rotation_q, translation) -> np.ndarray:
    t = np.eye(4)
    t[:3, :3] = Quaternion(rotation_q).rotation_matrix
    t[:3, 3] = translation
    return t


@dataclass
class SensorCalib:
    channel: str
    translation: list[float]
    rotation: list[float]  # sensor -> ego quaternion [w, x, y, z]
    intrinsic: list[list[float]]  # [] for the LiDAR

    @property
    def sensor2ego(self) -> np.ndarray:
        return transform(self.rotation, self.translation)


def camera_rotation(yaw_deg: float, pitch_deg: float, roll_deg: float) -> np.ndarray:
    """cam -> ego rotation for a camera looking along ``yaw`` (x right, y down, z forward)."""
    y = math.radians(yaw_deg)
    fwd = np.array([math.cos(y), math.sin(y), 0.0])
    right = np.array([math.sin(y), -math.cos(y), 0.0])
    down = np.array([0.0, 0.0, -1.0])
    base = np.stack([right, down, fwd], axis=1)
    p = math.radians(pitch_deg)
    r = math.radians(roll_deg)
    rx = np.array([[1, 0, 0], [0, math.cos(p), -math.sin(p)], [0, math.sin(p), math.cos(p)]])
    rz = np.array([[math.cos(r), -math.sin(r), 0], [math.sin(r), math.cos(r), 0], [0, 0, 1]])
    return base @ rx @ rz


def sensor_rig(seed: int, log_index: int, image_size: tuple[int, int]) -> dict[str, SensorCalib]:
    """Calibrations of one log: nuScenes-like mounting with small per-log perturbations."""
    rng = np.random.default_rng([seed, 7919, log_index])
    sx, sy = image_size[0] / NATIVE_SIZE[0], image_size[1] / NATIVE_SIZE[1]
    rig = {}
    for cam in CAMERAS:
        yaw, trans, f, cx, cy = CAMERA_RIG[cam]
        rot = camera_rotation(yaw + rng.normal(0, 0.3), -rng.uniform(0.0, 1.2), rng.normal(0, 0.2))
        k = [[f * sx, 0.0, cx * sx], [0.0, f * sy, cy * sy], [0.0, 0.0, 1.0]]
        t = (np.array(trans) + rng.normal(0, 0.005, 3)).tolist()
        rig[cam] = SensorCalib(cam, t, matrix_to_quat(rot), k)
    lidar_yaw = math.radians(LIDAR_YAW_DEG + rng.normal(0, 0.15))
    rig["LIDAR_TOP"] = SensorCalib("LIDAR_TOP", (LIDAR_TRANSLATION + rng.normal(0, 0.003, 3)).tolist(),
                                   yaw_quaternion(lidar_yaw), [])
    return rig


class Polyline:
    """Arc-length parameterised path: position, heading and curvature at any distance, in bulk."""

    def __init__(self, xy: np.ndarray, mode: str = "clamp") -> None:
        keep = np.concatenate([[True], np.linalg.norm(np.diff(xy, axis=0), axis=1) > 1e-6])
        self.xy = np.asarray(xy, dtype=np.float64)[keep]
        seg = np.linalg.norm(np.diff(self.xy, axis=0), axis=1)
        self.cum = np.concatenate([[0.0], np.cumsum(seg)])
        self.length = float(self.cum[-1])
        self.mode = mode  # clamp | loop | pingpong

    def _wrap(self, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Distance along the stored path and travel sign (-1 on the way back of a ping-pong)."""
        s = np.asarray(s, dtype=np.float64)
        if self.mode == "loop":
            return np.mod(s, self.length), np.ones_like(s)
        if self.mode == "pingpong":
            m = np.mod(s, 2 * self.length)
            back = m > self.length
            return np.where(back, 2 * self.length - m, m), np.where(back, -1.0, 1.0)
        return np.clip(s, 0.0, self.length), np.ones_like(s)

    def _interp(self, s: np.ndarray) -> np.ndarray:
        return np.stack([np.interp(s, self.cum, self.xy[:, 0]), np.interp(s, self.cum, self.xy[:, 1])], axis=-1)

    def position(self, s: np.ndarray) -> np.ndarray:
        return self._interp(self._wrap(s)[0])

    def heading(self, s: np.ndarray, delta: float = 0.75) -> np.ndarray:
        s_w, sign = self._wrap(s)
        if self.mode == "loop":
            p0, p1 = self.position(s_w - delta), self.position(s_w + delta)
        else:
            p0 = self._interp(np.clip(s_w - delta, 0.0, self.length))
            p1 = self._interp(np.clip(s_w + delta, 0.0, self.length))
        d = (p1 - p0) * sign[..., None]
        return np.arctan2(d[..., 1], d[..., 0])

    def curvature(self, s: np.ndarray, delta: float = 1.0) -> np.ndarray:
        h0 = self.heading(np.asarray(s) - delta)
        h1 = self.heading(np.asarray(s) + delta)
        return np.angle(np.exp(1j * (h1 - h0))) / (2 * delta)


@dataclass
class Motion:
    """Where an agent is along its path: s(t) = s0 + v_base t + a smooth speed wave (ego only)."""

    path: Polyline
    s0: float
    v_base: float
    v_amp: float = 0.0
    period: float = 8.0
    phase: float = 0.0

    def distance(self, t: np.ndarray) -> np.ndarray:
        w = 2 * math.pi / self.period
        t = np.asarray(t, dtype=np.float64)
        wave = -self.v_amp / w * (np.cos(w * t + self.phase) - math.cos(self.phase)) if self.v_amp else 0.0
        return self.s0 + self.v_base * t + wave

    def speed(self, t: np.ndarray) -> np.ndarray:
        w = 2 * math.pi / self.period
        return self.v_base + self.v_amp * np.sin(w * np.asarray(t, dtype=np.float64) + self.phase)

    def accel(self, t: np.ndarray) -> np.ndarray:
        w = 2 * math.pi / self.period
        return self.v_amp * w * np.cos(w * np.asarray(t, dtype=np.float64) + self.phase)

    def pose(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s = self.distance(t)
        return self.path.position(s), self.path.heading(s)


# category -> (mean w, l, h), jitter (w, l, h), colour palette (BGR)
AGENT_TYPES: dict[str, tuple[tuple[float, float, float], tuple[float, float, float], tuple[tuple[int, int, int], ...]]] = {
    "vehicle.car": ((1.95, 4.60, 1.70), (0.10, 0.30, 0.12),
                    ((40, 40, 200), (200, 200, 200), (30, 30, 30), (180, 120, 40), (60, 160, 60), (220, 220, 230),
                     (90, 90, 100), (20, 120, 220))),
    "vehicle.truck": ((2.50, 7.00, 2.95), (0.15, 1.00, 0.30), ((230, 230, 230), (40, 90, 200), (60, 60, 60))),
    "vehicle.bus.rigid": ((2.95, 11.2, 3.45), (0.05, 0.60, 0.10), ((30, 200, 240), (50, 50, 210), (230, 230, 230))),
    "vehicle.trailer": ((2.90, 12.3, 3.90), (0.05, 1.00, 0.20), ((200, 200, 200), (150, 150, 150))),
    "vehicle.construction": ((2.85, 6.40, 3.20), (0.10, 0.50, 0.20), ((0, 170, 240), (0, 140, 220))),
    "vehicle.motorcycle": ((0.77, 2.11, 1.47), (0.05, 0.10, 0.05), ((20, 20, 20), (30, 30, 180))),
    "vehicle.bicycle": ((0.60, 1.70, 1.28), (0.05, 0.08, 0.05), ((40, 40, 40), (160, 60, 60))),
    "human.pedestrian.adult": ((0.67, 0.73, 1.77), (0.06, 0.08, 0.08),
                               ((60, 40, 30), (40, 40, 140), (150, 150, 150), (30, 30, 30), (90, 60, 140))),
    "human.pedestrian.child": ((0.50, 0.50, 1.25), (0.05, 0.05, 0.10), ((40, 160, 220), (160, 80, 40))),
    "human.pedestrian.construction_worker": ((0.70, 0.76, 1.79), (0.05, 0.05, 0.05), ((0, 200, 255),)),
    "movable_object.trafficcone": ((0.41, 0.41, 1.00), (0.03, 0.03, 0.05), ((0, 90, 255),)),
    "movable_object.barrier": ((2.50, 0.50, 0.98), (0.20, 0.05, 0.05), ((230, 230, 230), (40, 40, 200))),
}
VEHICLE_MIX = (("vehicle.car", 0.72), ("vehicle.truck", 0.08), ("vehicle.bus.rigid", 0.05), ("vehicle.trailer", 0.02),
               ("vehicle.construction", 0.02), ("vehicle.motorcycle", 0.05), ("vehicle.bicycle", 0.06))


@dataclass
class Agent:
    token: str
    category: str
    size: tuple[float, float, float]  # w, l, h
    motion: Motion
    color: tuple[int, int, int]
    parked: bool = False

    def boxes(self, t: np.ndarray) -> np.ndarray:
        """(T, 7) x, y, z (centre), w, l, h, yaw in the map frame."""
        xy, yaw = self.motion.pose(np.atleast_1d(t))
        w, l, h = self.size
        out = np.empty((len(yaw), 7))
        out[:, :2] = xy
        out[:, 2] = h / 2
        out[:, 3:6] = (w, l, h)
        out[:, 6] = yaw
        return out

    def attribute(self, t: float) -> str | None:
        moving = abs(float(self.motion.speed(t))) > 0.3
        if self.category.startswith("human.pedestrian"):
            return "pedestrian.moving" if moving else "pedestrian.standing"
        if self.category in ("vehicle.bicycle", "vehicle.motorcycle"):
            return "cycle.with_rider" if moving or not self.parked else "cycle.without_rider"
        if self.category.startswith("vehicle"):
            return "vehicle.parked" if self.parked else ("vehicle.moving" if moving else "vehicle.stopped")
        return None


@dataclass
class Scene:
    index: int
    name: str
    token: str
    location: str
    log_index: int
    start_us: int
    keyframe_us: list[int]
    ego: Motion
    agents: list[Agent]
    route_turns: list[str] = field(default_factory=list)
    _batch: tuple | None = field(default=None, repr=False)

    def t(self, timestamp_us: int | np.ndarray) -> np.ndarray:
        """Seconds since the scene start, the time axis of every Motion."""
        return (np.asarray(timestamp_us, dtype=np.float64) - self.start_us) * 1e-6

    def ego_pose(self, timestamp_us: int) -> np.ndarray:
        """ego -> global (4x4) at a timestamp."""
        xy, yaw = self.ego.pose(self.t(timestamp_us))
        m = np.eye(4)
        c, s = math.cos(float(yaw)), math.sin(float(yaw))
        m[:3, :3] = [[c, -s, 0], [s, c, 0], [0, 0, 1]]
        m[:2, 3] = xy
        return m

    def agent_boxes(self, timestamp_us: int) -> tuple[np.ndarray, list[Agent]]:
        """(A, 7) boxes of every agent at a timestamp, evaluated for all agents at once."""
        if not self.agents:
            return np.zeros((0, 7)), []
        if self._batch is None or self._batch[0] != len(self.agents):
            self._batch = (len(self.agents), _AgentBatch(self.agents))
        return self._batch[1].boxes(float(self.t(timestamp_us))), list(self.agents)


class _AgentBatch:
    """All agents' paths concatenated, so one ``np.interp`` places every agent (they move at
    constant speed along their path; loops wrap, ping-pongs reflect, others clamp)."""

    def __init__(self, agents: list[Agent]) -> None:
        xs, ys, cums = [], [], []
        offset = 0.0
        self.offset, self.length, self.mode, self.s0, self.v = [], [], [], [], []
        for a in agents:
            p = a.motion.path
            xs.append(p.xy[:, 0])
            ys.append(p.xy[:, 1])
            cums.append(p.cum + offset)
            self.offset.append(offset)
            self.length.append(p.length)
            self.mode.append({"clamp": 0, "loop": 1, "pingpong": 2}[p.mode])
            self.s0.append(a.motion.s0)
            self.v.append(a.motion.v_base)
            offset += p.length + 1e3
        self.x, self.y, self.cum = np.concatenate(xs), np.concatenate(ys), np.concatenate(cums)
        self.offset, self.length = np.array(self.offset), np.array(self.length)
        self.mode, self.s0, self.v = np.array(self.mode), np.array(self.s0), np.array(self.v)
        self.size = np.array([a.size for a in agents])

    def _wrap(self, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        L = self.length
        loop = np.mod(s, L)
        m = np.mod(s, 2 * L)
        back = m > L
        ping = np.where(back, 2 * L - m, m)
        clamp = np.clip(s, 0.0, L)
        out = np.where(self.mode == 1, loop, np.where(self.mode == 2, ping, clamp))
        sign = np.where((self.mode == 2) & back, -1.0, 1.0)
        return out, sign

    def _xy(self, s_local: np.ndarray) -> np.ndarray:
        sg = s_local + self.offset
        return np.stack([np.interp(sg, self.cum, self.x), np.interp(sg, self.cum, self.y)], -1)

    def boxes(self, t: float, delta: float = 0.75) -> np.ndarray:
        s, sign = self._wrap(self.s0 + self.v * t)
        lo = np.where(self.mode == 1, np.mod(s - delta, self.length), np.clip(s - delta, 0.0, self.length))
        hi = np.where(self.mode == 1, np.mod(s + delta, self.length), np.clip(s + delta, 0.0, self.length))
        d = (self._xy(hi) - self._xy(lo)) * sign[:, None]
        out = np.empty((len(s), 7))
        out[:, :2] = self._xy(s)
        out[:, 2] = self.size[:, 2] / 2
        out[:, 3:6] = self.size
        out[:, 6] = np.arctan2(d[:, 1], d[:, 0])
        return out


def _route(city: CityMap, rng: np.random.Generator, start: str, min_length: float) -> tuple[np.ndarray, list[str]]:
    """Random walk on the lane graph from ``start`` until ``min_length`` metres are covered."""
    pts = [city.lanes[start].xy]
    length = city.lanes[start].length
    turns = []
    tok = start
    while length < min_length:
        options = city.lanes[tok].outgoing
        tok = options[int(rng.integers(len(options)))]
        lane = city.lanes[tok]
        if lane.is_connector:
            turns.append(lane.turn)
        pts.append(lane.xy[1:])
        length += lane.length
    return np.concatenate(pts), turns


def build_scene(
    city: CityMap,
    seed: int,
    index: int,
    name: str,
    log_index: int,
    n_keyframes: int,
    start_us: int,
) -> Scene:
    rng = np.random.default_rng([seed, 104729, index])
    duration = (n_keyframes - 1) * KEYFRAME_US * 1e-6
    horizon = duration + 8.0  # futures of 6 s and some slack
    v_base = float(rng.uniform(4.0, 9.0))
    v_amp = float(rng.uniform(0.0, min(2.5, v_base - 1.0)))
    start_lane = city.start_lanes[int(rng.integers(len(city.start_lanes)))]
    xy, turns = _route(city, rng, start_lane, (v_base + v_amp) * (horizon + 4) + 30.0)
    ego = Motion(Polyline(xy), s0=float(rng.uniform(5.0, 30.0)), v_base=v_base, v_amp=v_amp,
                 period=float(rng.uniform(6.0, 12.0)), phase=float(rng.uniform(0, 2 * math.pi)))
    keyframes = [start_us + k * KEYFRAME_US + int(rng.integers(-2000, 2000)) * (k > 0) for k in range(n_keyframes)]
    scene = Scene(index, name, make_token("scene", seed, name), city.location, log_index, start_us, keyframes, ego, [],
                  turns)
    scene.agents = _spawn_agents(city, rng, scene, horizon)
    return scene


def _offset_loop(xy: np.ndarray, left: float) -> np.ndarray:
    """Shift a closed polyline sideways (positive: to the left of its direction)."""
    d = np.roll(xy, -1, axis=0) - np.roll(xy, 1, axis=0)
    n = np.stack([-d[:, 1], d[:, 0]], -1)
    n /= np.linalg.norm(n, axis=1, keepdims=True) + 1e-9
    return xy + n * left


def _near(points: np.ndarray, track: np.ndarray, radius: float) -> np.ndarray:
    d = np.linalg.norm(points[:, None, :] - track[None, :, :], axis=-1)
    return d.min(axis=1) < radius


def _spawn_agents(city: CityMap, rng: np.random.Generator, scene: Scene, horizon: float) -> list[Agent]:
    times = np.arange(0.0, horizon, 0.25)
    ego_xy, _ = scene.ego.pose(times)
    track = ego_xy[::4]
    agents: list[Agent] = []

    def new_agent(category: str, motion: Motion, parked: bool = False) -> Agent:
        mean, jit, palette = AGENT_TYPES[category]
        size = tuple(float(m + rng.uniform(-j, j)) for m, j in zip(mean, jit))
        color = palette[int(rng.integers(len(palette)))]
        tok = make_token("instance", scene.token, len(agents))
        return Agent(tok, category, size, motion, color, parked)

    # Vehicles on lanes near the route, following their own random routes.
    lane_toks = [t for t in city.start_lanes if _near(city.lanes[t].xy[[0, -1]], track, 110.0).any()]
    names, probs = zip(*VEHICLE_MIX)
    for tok in lane_toks:
        lane = city.lanes[tok]
        if rng.random() > 0.85:
            continue
        outer = lane.outer
        count = int(rng.integers(1, 4))
        speed = float(rng.uniform(3.0, 11.0))
        positions = np.sort(rng.uniform(0.0, max(1.0, lane.length - 10.0), count))
        positions = positions[np.concatenate([[True], np.diff(positions) > 16.0])]
        for s0 in positions:
            category = str(rng.choice(names, p=np.array(probs) / sum(probs)))
            v = speed
            if category == "vehicle.bicycle":
                if not outer:
                    category = "vehicle.car"
                else:
                    v = min(speed, float(rng.uniform(3.0, 5.0)))
            path, _ = _route(city, rng, tok, s0 + v * horizon + 20.0)
            agents.append(new_agent(category, Motion(Polyline(path), float(s0), v)))

    # Parked cars in car parks near the route.
    if len(city.parking_spots):
        near = city.parking_spots[_near(city.parking_spots[:, :2], track, 90.0)]
        for x, y, yaw in near:
            if rng.random() < 0.55:
                seg = np.array([[x, y], [x + math.cos(yaw) * 0.1, y + math.sin(yaw) * 0.1]])
                agents.append(new_agent("vehicle.car", Motion(Polyline(seg), 0.05, 0.0), parked=True))

    # Pedestrians along sidewalks and across crossings.
    for loop in city.sidewalk_loops:
        poly = Polyline(loop, mode="loop")
        for s0 in np.arange(rng.uniform(0, 10), poly.length, 7.0):
            p = poly.position(np.array([s0]))
            if not _near(p, track, 60.0)[0] or rng.random() > 0.5:
                continue
            category = "human.pedestrian.adult" if rng.random() < 0.88 else "human.pedestrian.child"
            speed = 0.0 if rng.random() < 0.2 else float(rng.uniform(0.9, 1.6)) * (1 if rng.random() < 0.5 else -1)
            if speed == 0.0:
                seg = poly.position(np.array([s0, s0 + 0.5]))
                yaw_jitter = np.array([[0.0, 0.0], [rng.normal(0, 0.3), rng.normal(0, 0.3)]])
                motion = Motion(Polyline(seg + yaw_jitter), 0.1, 0.0)
            else:
                # keep to the right: offset the walking line by 0.6 m towards the walker's right
                walk_xy = _offset_loop(poly.xy, -0.6 if speed > 0 else 0.6)
                walk = Polyline(walk_xy, mode="loop")
                motion = Motion(walk, float(s0) * walk.length / poly.length, speed)
            agents.append(new_agent(category, motion))
    for seg in city.crossing_paths:
        if _near(seg[:1], track, 70.0)[0] and rng.random() < 0.4:
            poly = Polyline(seg, mode="pingpong")
            agents.append(new_agent("human.pedestrian.adult",
                                    Motion(poly, float(rng.uniform(0, poly.length)), float(rng.uniform(0.9, 1.5)))))

    # A construction zone: cones and barriers along a curb, with a worker.
    if len(city.curb_sites) and rng.random() < 0.6:
        near = np.flatnonzero(_near(city.curb_sites[:, :2], track, 45.0))
        if len(near):
            first = int(rng.choice(near))
            for k, site in enumerate(city.curb_sites[first:first + 8]):
                x, y, yaw = site
                category = "movable_object.barrier" if k % 4 == 3 else "movable_object.trafficcone"
                seg = np.array([[x, y], [x + math.cos(yaw) * 0.1, y + math.sin(yaw) * 0.1]])
                agents.append(new_agent(category, Motion(Polyline(seg), 0.05, 0.0)))

    return _remove_collisions(agents, scene, times)


EGO_HALF_LENGTH, EGO_HALF_WIDTH, EGO_CENTRE_X = 2.3, 0.95, 1.3  # Renault Zoe around its rear axle


def _obb_overlap(c1: np.ndarray, h1: np.ndarray, y1: np.ndarray, c2: np.ndarray, h2: np.ndarray, y2: np.ndarray,
                 margin: float = 0.3) -> np.ndarray:
    """Separating-axis test of 2D oriented boxes (centres, half sizes (l/2, w/2), yaws), in bulk."""
    overlap = np.ones(np.broadcast_shapes(y1.shape, y2.shape), dtype=bool)
    axes1 = np.stack([np.stack([np.cos(y1), np.sin(y1)], -1), np.stack([-np.sin(y1), np.cos(y1)], -1)])
    axes2 = np.stack([np.stack([np.cos(y2), np.sin(y2)], -1), np.stack([-np.sin(y2), np.cos(y2)], -1)])
    d = c2 - c1
    for axis in (*axes1, *axes2):
        proj = np.abs((d * axis).sum(-1))
        r1 = h1[..., 0] * np.abs((axes1[0] * axis).sum(-1)) + h1[..., 1] * np.abs((axes1[1] * axis).sum(-1))
        r2 = h2[..., 0] * np.abs((axes2[0] * axis).sum(-1)) + h2[..., 1] * np.abs((axes2[1] * axis).sum(-1))
        overlap &= proj < r1 + r2 + margin
    return overlap


def _remove_collisions(agents: list[Agent], scene: Scene, times: np.ndarray) -> list[Agent]:
    """Drop agents that would overlap the ego or an earlier kept agent during the scene."""
    if not agents:
        return agents
    times = times[times <= scene.t(scene.keyframe_us[-1]) + 0.5]
    ego_xy, ego_yaw = scene.ego.pose(times)
    ego_c = ego_xy + EGO_CENTRE_X * np.stack([np.cos(ego_yaw), np.sin(ego_yaw)], -1)
    poses = [a.motion.pose(times) for a in agents]
    pos = np.stack([p[0] for p in poses])  # (A, T, 2)
    yaw = np.stack([p[1] for p in poses])  # (A, T)
    half = np.array([[a.size[1] / 2, a.size[0] / 2] for a in agents])  # (A, 2)
    ego_hit = _obb_overlap(ego_c[None], np.array([EGO_HALF_LENGTH, EGO_HALF_WIDTH]), ego_yaw[None],
                           pos, half[:, None, :], yaw, margin=1.0).any(axis=1)
    radius = np.linalg.norm(half, axis=1)
    kept: list[int] = []
    for i in np.flatnonzero(~ego_hit):
        if kept:
            k = np.array(kept)
            close = (np.linalg.norm(pos[k] - pos[i][None], axis=-1) < (radius[k] + radius[i])[:, None]).any(axis=1)
            k = k[close]
            if len(k) and _obb_overlap(pos[k], half[k][:, None, :], yaw[k], pos[i][None], half[i], yaw[i][None],
                                       margin=0.2).any():
                continue
        kept.append(int(i))
    return [agents[i] for i in kept]
