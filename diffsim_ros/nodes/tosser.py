"""
Simulated toss rig: a MuJoCo cube with hidden parameters, tossed again and again, tracked.

Publishes the cube's pose on ``pose_topic`` (``geometry_msgs/PoseStamped``, sensor-data QoS,
``frame_id`` ``world_frame``) at ``rate_hz`` (148 Hz: the ContactNets rig's rate) while it is
tracked, and the hidden truth once on ``~/truth`` (``std_msgs/String``, transient local,
JSON ``{"half_width", "friction", "inertial"}``) so a demo can compare.  The hidden cube
(:func:`~diffsim_ros.sim.tosser.hidden_box`) is drawn from ``seed`` unless ``half_width`` /
``friction`` are given; the releases (:class:`~diffsim_ros.sim.tosser.Tosser`) are seeded
too.  Between tosses the cube is picked up: untracked for ``pickup_time`` s.

Clock modes (``clock_mode``) as ``sim_driver``'s: ``realtime`` (a wall-clock timer, stamps
from the node clock) or ``lockstep`` (a thread steps as fast as the ``/lockstep`` peers let
it, or at ``real_time_factor`` times real time; stamps are the simulation's time, then
``/clock``): run the identifier with ``use_sim_time`` and what it learns does not depend on
the machine's speed.
"""

from dataclasses import dataclass, field
import json
import threading
import time

from geometry_msgs.msg import PoseStamped
from rclpy.clock import Clock, ClockType
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, qos_profile_sensor_data, QoSProfile
from rosgraph_msgs.msg import Clock as ClockMsg
from std_msgs.msg import String
import torch

from .convert import pose_msg, sec_to_stamp, ThrottledLogger
from .lockstep import await_matched, lockstep_ticks, PeerWaiter
from .object_identifier import object_defaults
from .params import declare_config, meta
from .runtime import configure_interpreter, run_node
from ..core import load_urdf
from ..core.configuration import root_pose_matrix
from ..io.tosses import CUBE_HALF_WIDTH_M
from ..robots import object_urdf_path
from ..sim.tosser import hidden_box, Tosser

__all__ = ['TosserConfig', 'TosserNode', 'main']


@dataclass(frozen=True)
class TosserConfig:
    """Parameters of the simulated toss rig (see the module docstring)."""

    clock_mode: str = field(default='realtime', metadata=meta(
        "'realtime' (wall-clock timer) or 'lockstep' (publish /clock; others use_sim_time)"))
    real_time_factor: float = field(default=0.0, metadata=meta(
        'lockstep only: pace at this multiple of real time; 0 = as fast as the peers allow',
        range=(0.0, 1000.0)))
    peer_timeout: float = field(default=600.0, metadata=meta(
        'lockstep only: safety timeout, wall s, of a hold by a /lockstep peer',
        range=(0.0, 86400.0)))
    rate_hz: float = field(default=148.0, metadata=meta('pose rate, Hz',
                                                        range=(1.0, 10000.0)))
    pose_topic: str = field(default='mocap/cube', metadata=meta('the PoseStamped topic'))
    world_frame: str = field(default='world', metadata=meta('frame_id of the poses'))
    seed: int = field(default=0, metadata=meta('seed of the hidden cube and the releases'))
    half_width: float = field(default=0.0, metadata=meta(
        'hidden half width, m; 0 = drawn: 0.8-1.25 x the nominal 0.0524', range=(0.0, 1.0)))
    friction: float = field(default=0.0, metadata=meta(
        'hidden friction; 0 = drawn in [0.1, 0.5]', range=(0.0, 5.0)))
    inertia_error: float = field(default=0.1, metadata=meta(
        'relative range of the hidden principal inertia offsets', range=(0.0, 0.5)))
    rest_time: float = field(default=0.3, metadata=meta(
        'rest after which the cube is picked up, s', range=(0.0, 60.0)))
    pickup_time: float = field(default=0.3, metadata=meta(
        'untracked time between rest and the next release, s', range=(0.0, 60.0)))
    substeps: int = field(default=40, metadata=meta('MuJoCo steps per pose', range=(1, 10000)))

    def __post_init__(self) -> None:
        """Validate the clock mode."""
        if self.clock_mode not in ('realtime', 'lockstep'):
            raise ValueError(f"clock_mode must be 'realtime' or 'lockstep', got "
                             f'{self.clock_mode!r}')


class TosserNode(Node):
    """
    The simulated toss rig (executable ``tosser``).

    :param kwargs: ``rclpy.node.Node`` arguments (``context``, ``parameter_overrides``, ...).
    """

    PARAMETERS = {'': TosserConfig}

    def __init__(self, **kwargs) -> None:
        """Declare parameters, draw the hidden cube, start the clock."""
        super().__init__(kwargs.pop('node_name', 'tosser'), **kwargs)
        configure_interpreter()
        self.config = config = declare_config(self, TosserConfig,
                                              defaults=object_defaults(self))
        model = load_urdf(str(object_urdf_path('cube_toss')), floating_base=True,
                          dtype=torch.float64)
        self.box = hidden_box(model, config.seed, config.half_width, config.friction,
                              inertia_error=config.inertia_error,
                              nominal_half_width=CUBE_HALF_WIDTH_M)
        self.rig = Tosser(model, self.box, config.rate_hz, config.seed, config.substeps,
                          config.rest_time, config.pickup_time)
        self.warnings = ThrottledLogger(self.get_logger())
        self.pose_pub = self.create_publisher(PoseStamped, config.pose_topic,
                                              qos_profile_sensor_data)
        truth = self.create_publisher(String, '~/truth', QoSProfile(
            depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL))
        truth.publish(String(data=json.dumps({'half_width': self.box.half_width,
                                              'friction': self.box.friction,
                                              'inertial': list(self.box.inertial)})))
        self.lockstep = config.clock_mode == 'lockstep'
        self.clock_pub = self.create_publisher(ClockMsg, '/clock', 10) if self.lockstep else None
        self.peers = PeerWaiter(self, config.peer_timeout, self.warnings.warn) \
            if self.lockstep else None
        self.published = 0
        self._stop = threading.Event()
        self._thread = self._timer = None
        if self.lockstep:
            self._thread = threading.Thread(target=self._run_lockstep, daemon=True)
            self._thread.start()
        else:
            self._start = time.monotonic()
            self._timer = self.create_timer(self.rig.period, self._on_timer,
                                            clock=Clock(clock_type=ClockType.STEADY_TIME))
        self.get_logger().info(f'hidden cube: half width {self.box.half_width:.4f} m, '
                               f'friction {self.box.friction:.3f}; {config.clock_mode}')

    def tick(self) -> None:
        """Advance one pose period and publish the pose (when tracked), then the clock."""
        q = self.rig.step()
        stamp = sec_to_stamp(self.rig.time) if self.lockstep else \
            self.get_clock().now().to_msg()
        if q is not None:
            T = root_pose_matrix(torch.as_tensor(q)).numpy()
            self.pose_pub.publish(pose_msg(T, self.config.world_frame, stamp))
            self.published += 1
        if self.lockstep:
            self.clock_pub.publish(ClockMsg(clock=stamp))

    def _on_timer(self) -> None:
        """Real time: run the ticks that are due (at most 5 at once)."""
        due = int((time.monotonic() - self._start) / self.rig.period) - self.rig.tick
        for _ in range(min(max(due, 0), 5)):
            self.tick()

    def _run_lockstep(self) -> None:
        """Lockstep: hold for peers, tick, pace; until stopped."""
        factor = self.config.real_time_factor
        try:
            await_matched(self, (self.pose_pub, self.clock_pub), 5.0, self._stop)
            for _ in lockstep_ticks(self, self.peers, self._stop, factor, lambda: int(round(
                    (self.rig.tick + 1) * self.rig.period * 1e9))):
                self.tick()
        except Exception as error:  # noqa: B902 - shutdown races end the loop, quietly
            if self.context.ok():
                self.get_logger().error(f'lockstep loop stopped: {error!r}')

    def destroy_node(self) -> None:
        """Stop the rig, then destroy the node."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if self._timer is not None:
            self._timer.cancel()
        super().destroy_node()


def main(args=None) -> None:
    """Run the node (``ros2 run diffsim_ros tosser``)."""
    run_node(TosserNode, args)


if __name__ == '__main__':
    main()
