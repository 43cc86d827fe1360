"""
Simulated robot driver: the MuJoCo plant behind a driver's topics, on a domain without one.

Subscribes ``/<controller_name>/commands`` (``std_msgs/Float64MultiArray`` in the catalog's
``command_joints`` order, N m, N or V) and publishes ``joint_states`` at the robot's rate
(sensor-data QoS, ``effort`` = the actuator torque the plant applies) and one
``geometry_msgs/PoseStamped`` per tracked body on ``<mocap_topic_prefix>/<body>``.  The
plant's "true" parameters differ from the nominal model by ``param_error`` (seeded), or come
from ``true_parameters_file`` (YAML of :class:`diffsim_ros.sim.TrueParameters`).

Clock modes (``clock_mode``):

* ``realtime``: a wall-clock timer steps the plant at its rate; stamps are the node's clock.
* ``lockstep``: a thread steps the plant as fast as it can (or at ``real_time_factor``
  times real time), publishes each tick's messages stamped with the plant time and then
  ``/clock`` at that time.  Run every other node with ``use_sim_time:=true`` so that their
  clocks, timers and command timeouts follow the plant; tests and the laptop demo use it.
  The state comes first so that a node's timer firing at ``t_k`` finds the state of
  ``t_k`` already taken (rclpy runs a node's subscriptions, ``/clock``'s first, before
  the timers the new time makes ready): a controller commanding on its timer answers the
  newest state, not the one before it depending on the machine's speed, and a refit due at
  ``t_k`` has that state in its window.  Such a state is stamped one period ahead of the
  receiving node's clock until ``/clock`` arrives.
  Simulated time then waits for the work due in it, so that a closed loop in simulated time
  does not depend on how fast or busy the computer is (the lockstep of PX4's and Gazebo's
  simulators):

  - after each tick the driver waits for the controller's command answering it: the
    controller sees every state and the plant gets every command one tick later.  It waits
    only once a controller has commanded (or from the first tick, when the command topic
    already has a publisher then), only while the command topic has a publisher
    (one gone for :data:`~diffsim_ros.nodes.lockstep.GRAPH_GRACE_S` s is not waited for),
    and at most ``command_wait`` wall seconds, a safety timeout that logs an error and
    stops the waits until the next command arrives;
  - before each tick it waits for the peers of the lockstep protocol
    (:mod:`diffsim_ros.nodes.lockstep`): no tick passes an identifier's due refit until the
    refit has finished and the mpc has the model it produced; at most ``peer_timeout`` wall
    seconds per hold (then an error), and never for a peer that left the ROS graph.

  ``real_time_factor`` paces the ticks in between; time spent holding for peers is not
  made up afterwards.

Given ``scene: cup`` (``config/wam4_cup.yaml``; robot ``wam4``), the plant is the ball in a
cup (:class:`~diffsim_ros.sim.cup_driver.CupDriverPlant`): the WAM-4 with a cup on
``wam/tool_link`` and a ball on a string of ``string_length`` (the hidden truth, string,
cup transform, ball mass and arm, drawn from ``seed``: :func:`~diffsim_ros.sim.cup.
draw_truth`), with the same topics, commands, lockstep and clock; the ball's centre is
the mocap body ``ball`` (``<mocap_topic_prefix>/ball``, identity orientation, world frame,
at ``mocap_rate_hz``, noise ``ball_noise_std``), and ``~/ball_in_cup`` (``std_msgs/Bool``,
latched, ten times a second of plant time) says whether the ball has been in the cup for the
last 0.2 s (:func:`~diffsim_ros.sim.cup.in_cup`).

A bad command (wrong length, NaN/Inf) is dropped with a throttled warning and the last valid
command stays; after ``command_timeout`` s without a valid command the driver applies zero,
as a ros2_control forward command controller with a timeout would.

Given an ``object`` (``-p object:=cube``, or in the ``sim_driver`` section of a parameter
file; ``launch/object.launch.py``), the driver is instead a simulated toss rig
(:class:`TossRig`): a MuJoCo cube with hidden parameters, tossed again and again, its pose
published on ``pose_topic`` (``geometry_msgs/PoseStamped``, sensor-data QoS, ``frame_id``
``world_frame``) at ``rate_hz`` (148 Hz: the ContactNets rig's rate) while it is tracked,
and the hidden truth once on ``~/truth`` (``std_msgs/String``, transient local, JSON
``{"half_width", "friction", "inertial"}``).  The hidden cube
(:func:`~diffsim_ros.sim.tosser.hidden_box`) is drawn from ``seed`` unless ``half_width`` /
``friction`` are given; the releases are seeded too; between tosses the cube is untracked
for ``pickup_time`` s.  Its clock modes are the robot's.

On a domain that already carries a robot's graph, the simulated driver would publish
simulated states into it (its controllers would act on them) and take its controller's
commands.  So before it creates any publisher, the driver listens on its domain for
:data:`~diffsim_ros.nodes.foreign_graph.FOREIGN_PROBE_S` s and refuses to start (one
``[ERROR]`` line naming the topics and the nodes on them, exit status 1) where another node
publishes a stream the driver would publish: its ``joint_states`` topic (resolved in its
namespace) or a mocap topic (the toss rig: its ``pose_topic``), and ``/clock`` in lockstep
mode.  Subscribers do not count (the identifier, mpc and monitor of its own graph, RViz),
nor does the command topic: the graph's own mpc publishes it, and from the graph a real
controller's publisher cannot be told from it (a real driver publishes ``joint_states``,
which is refused).  Nor does ``/clock`` in real-time mode, where the driver publishes
none and its graph runs on the wall clock.  Two simulated drivers share a domain only
where their streams differ: other namespaces or topic names, one at most in lockstep.
(``diffsim-demo`` applies the same probe to its whole graph.)
"""


from dataclasses import dataclass, field
import json
import sys
import threading
import time

from geometry_msgs.msg import PoseStamped
import numpy as np
from rclpy.clock import Clock, ClockType
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, qos_profile_sensor_data, QoSProfile
from rosgraph_msgs.msg import Clock as ClockMsg
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool, Empty, Float64MultiArray, String
import torch
import yaml

from .convert import (commands_array, joint_state_msg, MessageError, pose_msg, sec_to_stamp,
                      ThrottledLogger)
from .foreign_graph import READY_QOS, refuse_foreign_graph
from .lockstep import await_matched, CommandWaiter, lockstep_ticks, PeerWaiter
from .object_identifier import object_defaults, object_mode
from .params import declare_config, declare_robot, meta
from .runtime import configure_interpreter, run_node
from .. import robots
from ..core import load_urdf
from ..core.configuration import root_pose_matrix
from ..io.tosses import CUBE_HALF_WIDTH_M
from ..robots import object_urdf_path
from ..sim import MujocoPlant, PlantConfig, TrueParameters
from ..sim.cup import CupNoise, draw_truth
from ..sim.cup_driver import CupDriverPlant
from ..sim.tosser import hidden_box, Tosser

__all__ = ['SimDriver', 'SimDriverConfig', 'TossRig', 'TosserConfig', 'main']

_CLOCK_MODES = ('realtime', 'lockstep')
_SCENES = ('', 'cup')
#: Lockstep: wall seconds at most to wait, before the first tick, for the readers the ROS
#: graph knows of to match the state and clock publishers (a first tick they miss would
#: leave a controller that is already there without the state it must answer).
LISTENER_WAIT_S = 5.0
#: How to run a simulated graph on a free domain, as the refusal says it.
FREE_DOMAIN = ('run the simulated graph on a free domain: ROS_DOMAIN_ID=<free id> '
               'ros2 launch diffsim_ros <file> (or export it before ros2 run)')


def refuse_foreign_streams(node, topics, lockstep: bool, harm: str, since: float) -> None:
    """
    Refuse to start a simulated driver where another node publishes one of its streams.

    The module docstring says which streams count and why.

    :param node: the driver, before it has created its publishers.
    :param topics: the topics it will publish states on, as given (resolved here with the
        node's namespace and remappings).
    :param lockstep: it will publish ``/clock``.
    :param harm: what it would do there (for the message).
    :param since: ``time.monotonic()`` at the node's creation.
    :raises ~diffsim_ros.nodes.foreign_graph.ForeignGraphError: naming the topics, the
        nodes on them and :data:`FREE_DOMAIN`.
    """
    publishers = [node.resolve_topic_name(topic) for topic in topics]
    refuse_foreign_graph(node, publishers + (['/clock'] if lockstep else []), harm=harm,
                         remedy=FREE_DOMAIN, since=since)


@dataclass(frozen=True)
class SimDriverConfig:
    """Parameters of the simulated driver (see the module docstring)."""

    clock_mode: str = field(default='realtime', metadata=meta(
        "'realtime' (wall-clock timer) or 'lockstep' (publish /clock, step as fast as "
        'possible; other nodes need use_sim_time)'))
    real_time_factor: float = field(default=0.0, metadata=meta(
        'lockstep only: pace the plant at this multiple of real time; 0 = as fast as possible',
        range=(0.0, 1000.0)))
    command_wait: float = field(default=10.0, metadata=meta(
        "lockstep only: safety timeout, wall s, of each tick's wait for the controller's "
        'command (an error, then no waits until the next command); 0 = never wait',
        range=(0.0, 3600.0)))
    peer_timeout: float = field(default=600.0, metadata=meta(
        'lockstep only: safety timeout, wall s, of a hold by a /lockstep peer (a due refit, '
        'a model not yet taken); then an error and the peer is ignored until it announces '
        'again; 0 = never wait for peers', range=(0.0, 86400.0)))
    rate_hz: float = field(default=0.0, metadata=meta(
        "joint_states and command-loop rate, Hz; 0 = the robot's driver rate",
        range=(0.0, 10000.0)))
    joint_states_topic: str = field(default='joint_states', metadata=meta(
        'topic of the published sensor_msgs/JointState'))
    command_topic: str = field(default='', metadata=meta(
        "std_msgs/Float64MultiArray command topic; '' = /<controller_name>/commands"))
    command_timeout: float = field(default=0.5, metadata=meta(
        'seconds without a valid command after which zero is applied; 0 = hold forever',
        range=(0.0, 3600.0)))
    mocap_bodies: tuple[str, ...] = field(default=(), metadata=meta(
        "links whose world poses are published; empty = the robot's end-effector link"))
    mocap_topic_prefix: str = field(default='mocap', metadata=meta(
        'poses go to <prefix>/<link> as geometry_msgs/PoseStamped'))
    mocap_rate_hz: float = field(default=100.0, metadata=meta(
        'motion-capture rate, Hz (rounded to a divider of rate_hz); 0 = no mocap',
        range=(0.0, 10000.0)))
    world_frame: str = field(default='world', metadata=meta('frame_id of the mocap poses'))
    param_error: float = field(default=0.3, metadata=meta(
        'relative error of the hidden true parameters (0.3 = 30 %), seeded by seed'))
    actuator_error: float = field(default=0.0, metadata=meta(
        'relative error of the true actuator gains / motor constants'))
    seed: int = field(default=0, metadata=meta('seed of the true parameters and the noise'))
    true_parameters_file: str = field(default='', metadata=meta(
        "YAML file of explicit TrueParameters (replaces param_error); '' = sampled"))
    q_noise_std: float = field(default=0.0, metadata=meta('position noise std, rad or m',
                                                          range=(0.0, 10.0)))
    qd_noise_std: float = field(default=0.0, metadata=meta('velocity noise std',
                                                           range=(0.0, 100.0)))
    q0: tuple[float, ...] = field(default=(), metadata=meta(
        'initial positions in joint order; empty = home'))
    scene: str = field(default='', metadata=meta(
        "'' = the robot alone; 'cup' (wam4 only): a cup on wam/tool_link and a ball on a "
        'string, hidden truth drawn from seed (sim/cup.py draw_truth), the ball published as '
        "the mocap body 'ball' and ~/ball_in_cup"))
    string_length: float = field(default=0.40, metadata=meta(
        "cup scene: the string's nominal length, m (the hidden one is drawn within 1 cm)",
        range=(0.12, 2.0)))
    ball_noise_std: float = field(default=0.0, metadata=meta(
        "cup scene: the ball's mocap position noise std, m", range=(0.0, 1.0)))

    def __post_init__(self) -> None:
        """Validate choices and ranges."""
        if self.clock_mode not in _CLOCK_MODES:
            raise ValueError(f'clock_mode must be one of {_CLOCK_MODES}, got {self.clock_mode!r}')
        if self.scene not in _SCENES:
            raise ValueError(f'scene must be one of {_SCENES}, got {self.scene!r}')
        for name in ('real_time_factor', 'command_wait', 'peer_timeout', 'rate_hz',
                     'command_timeout', 'mocap_rate_hz'):
            value = getattr(self, name)
            if not (np.isfinite(value) and value >= 0.0):
                raise ValueError(f'{name} must be finite and >= 0, got {value!r}')

    def plant_config(self, robot: str) -> PlantConfig:
        """
        Return the plant configuration these parameters describe.

        :param robot: catalog robot name.
        :return: the :class:`~diffsim_ros.sim.PlantConfig`.
        """
        true_parameters = None
        if self.true_parameters_file:
            with open(self.true_parameters_file, encoding='utf-8') as stream:
                true_parameters = TrueParameters.from_dict(yaml.safe_load(stream) or {})
        return PlantConfig(robot=robot, rate_hz=self.rate_hz or None,
                           q_noise_std=self.q_noise_std, qd_noise_std=self.qd_noise_std,
                           true_parameters=true_parameters, param_error=self.param_error,
                           actuator_error=self.actuator_error, seed=self.seed,
                           tracked_bodies=self.mocap_bodies or None)

    def plant(self, robot: str):
        """
        Return the plant these parameters describe: the robot's, or its cup scene.

        :param robot: catalog robot name.
        :return: a :class:`~diffsim_ros.sim.MujocoPlant` or a
            :class:`~diffsim_ros.sim.cup_driver.CupDriverPlant`.
        :raises ValueError: a cup scene for another robot than ``wam4``.
        """
        if self.scene != 'cup':
            return MujocoPlant(self.plant_config(robot))
        if robot != 'wam4':
            raise ValueError(f"scene 'cup' is the WAM-4's (robot wam4), got robot {robot!r}")
        return CupDriverPlant(draw_truth(self.seed, self.string_length, self.param_error),
                              CupNoise(self.q_noise_std, self.qd_noise_std,
                                       self.ball_noise_std), self.seed)


class SimDriver(Node):
    """
    The simulated driver node (executable ``sim_driver``).

    :param kwargs: ``rclpy.node.Node`` arguments (``context``, ``parameter_overrides``, ...).
    """

    def __init__(self, **kwargs) -> None:
        """Declare parameters, build the plant, create the interfaces and start the clock."""
        super().__init__(kwargs.pop('node_name', 'sim_driver'), **kwargs)
        created = time.monotonic()
        # first, so that destroy_node works on a driver refused half-way
        self._stop = threading.Event()
        self._thread = None
        self._timer = None
        configure_interpreter()   # torch in callbacks: see nodes/runtime.py
        self.robot, defaults = declare_robot(self)
        self.config = config = declare_config(self, SimDriverConfig, defaults=defaults)
        self.info = robots.get(self.robot)
        self.plant = config.plant(self.robot)
        self.plant.reset(q0=config.q0 or None)
        self.warnings = ThrottledLogger(self.get_logger())
        self._lock = threading.Lock()
        self._command = np.zeros(len(self.plant.command_joints))
        self._command_time = None
        self._timed_out = False
        self.stats = {'ticks': 0}
        self.command_topic = config.command_topic or f'/{self.info.controller_name}/commands'
        self.lockstep = config.clock_mode == 'lockstep'
        mocap_topics = {body: f'{config.mocap_topic_prefix}/{body}'
                        for body in (self.plant.tracked_bodies if config.mocap_rate_hz > 0
                                     else ())}
        refuse_foreign_streams(
            self, [config.joint_states_topic, *mocap_topics.values()], self.lockstep,
            'The simulated driver would publish simulated states into it (its controllers '
            "would act on them) and take its controller's commands", created)
        self.joint_states_pub = self.create_publisher(
            JointState, config.joint_states_topic, qos_profile_sensor_data)
        self.mocap_pubs = {body: self.create_publisher(PoseStamped, topic,
                                                       qos_profile_sensor_data)
                           for body, topic in mocap_topics.items()}
        self._mocap_every = max(1, round(self.plant.rate_hz / config.mocap_rate_hz)) \
            if config.mocap_rate_hz > 0 else 0
        self.create_subscription(Float64MultiArray, self.command_topic, self._on_command, 10)
        # cup scene: the success rule, ten times a second of plant time (latched)
        self.ball_in_cup_pub = self.create_publisher(Bool, '~/ball_in_cup', QoSProfile(
            depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)) \
            if config.scene == 'cup' else None
        self._in_cup_every = max(1, round(self.plant.rate_hz / 10.0))
        self.clock_pub = self.create_publisher(ClockMsg, '/clock', 10) if self.lockstep else None
        self.peers = PeerWaiter(self, config.peer_timeout, self.warnings.warn) \
            if self.lockstep else None
        self.commands = CommandWaiter(self, self.resolve_topic_name(self.command_topic),
                                      config.command_wait if self.lockstep else 0.0)
        # the probe passed: a simulated launch's mpc commands once it hears this (latched),
        # sent before the first state
        self.ready_pub = self.create_publisher(Empty, '~/ready', READY_QOS)
        self.ready_pub.publish(Empty())
        if self.lockstep:
            self._thread = threading.Thread(target=self._run_lockstep, daemon=True)
            self._thread.start()
        else:
            self._start = time.monotonic()
            self._timer = self.create_timer(self.plant.period, self._on_timer,
                                            clock=Clock(clock_type=ClockType.STEADY_TIME))
        self.get_logger().info(f'{self.plant!r}, {config.clock_mode}, commands on '
                               f'{self.command_topic}')

    def now(self) -> float:
        """
        Return the driver's time: the plant time in lockstep, else the node clock.

        :return: seconds.
        """
        if self.lockstep:
            return self.plant.time
        return self.get_clock().now().nanoseconds * 1e-9

    def _on_command(self, msg: Float64MultiArray) -> None:
        """Validate and store a command (applied from the next tick on)."""
        try:
            u = commands_array(msg, len(self.plant.command_joints))
        except MessageError as error:
            self.warnings.warn('commands', f'dropped: {error}; keeping the last valid command')
            return
        with self._lock:
            self._command, self._command_time, self._timed_out = u, self.now(), False
        self.commands.answered()

    def _current_command(self) -> np.ndarray:
        """Return the command to apply now (zero after the timeout)."""
        with self._lock:
            timeout = self.config.command_timeout
            if self._command_time is not None and timeout > 0 \
                    and self.now() - self._command_time > timeout:
                if not self._timed_out:
                    self.get_logger().warning(f'no command for {timeout} s: applying zero')
                self._command, self._command_time, self._timed_out = \
                    np.zeros_like(self._command), None, True
            return self._command

    def tick(self) -> None:
        """Advance the plant one period and publish its measurement."""
        measurement = self.plant.step(self._current_command())
        stamp = sec_to_stamp(measurement.t) if self.lockstep else \
            self.get_clock().now().to_msg()
        effort = measurement.tau_applied
        self.joint_states_pub.publish(joint_state_msg(
            self.plant.joint_names, measurement.q, measurement.qd, effort, stamp))
        if self._mocap_every and self.plant.tick % self._mocap_every == 0:
            for body, publisher in self.mocap_pubs.items():
                publisher.publish(pose_msg(measurement.poses[body], self.config.world_frame,
                                           stamp))
        if self.ball_in_cup_pub is not None and self.plant.tick % self._in_cup_every == 0:
            self.ball_in_cup_pub.publish(Bool(data=self.plant.in_cup()))
        if self.lockstep:   # after the state: see the module docstring
            self.clock_pub.publish(ClockMsg(clock=stamp))

    def _on_timer(self) -> None:
        """Real time: run the ticks that are due (at most 5 at once, then skip ahead)."""
        due = int((time.monotonic() - self._start) / self.plant.period)
        behind = due - self.plant.tick
        if behind > 5:
            self.warnings.warn('overrun', f'{behind} ticks behind real time; skipping ahead')
            self._start += (behind - 1) * self.plant.period
            behind = 1
        for _ in range(max(behind, 0)):
            self.tick()

    def _run_lockstep(self) -> None:
        """Lockstep: hold for peers, tick, wait for the command, pace; until stopped."""
        factor = self.config.real_time_factor
        try:
            # a controller already listening is waited for from the first tick on: the
            # ticks before its first command would otherwise depend on how fast it answers
            await_matched(self, (self.joint_states_pub, self.clock_pub), LISTENER_WAIT_S,
                          self._stop)
            self.commands.arm_if_listening()
            for _ in lockstep_ticks(self, self.peers, self._stop, factor, lambda: int(round(
                    (self.plant.tick + 1) * self.plant.period * 1e9))):
                self.commands.expect()
                self.tick()
                self.stats['ticks'] += 1
                self.commands.wait(self.plant.time, self._stop)
        except Exception as error:  # noqa: B902 - shutdown races end the loop, quietly
            if self.context.ok():
                self.get_logger().error(f'lockstep loop stopped: {error!r}')

    def stop(self) -> None:
        """Stop stepping the plant (lockstep thread or real-time timer); the node stays up."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        if self._timer is not None:
            self._timer.cancel()

    def destroy_node(self) -> None:
        """Stop the plant, then destroy the node."""
        self.stop()
        super().destroy_node()


@dataclass(frozen=True)
class TosserConfig:
    """Parameters of the simulated toss rig (module docstring: the toss rig)."""

    object: str = field(default='cube', metadata=meta(  # noqa: A003 - the identifier's name
        "the tossed object: 'cube' (a box drawn around the ContactNets cube); selects "
        'config/<object>.yaml'))
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
        """Validate the object and the clock mode."""
        if self.object != 'cube':
            raise ValueError(f"object: the simulated rig tosses 'cube', got {self.object!r}")
        if self.clock_mode not in ('realtime', 'lockstep'):
            raise ValueError(f"clock_mode must be 'realtime' or 'lockstep', got "
                             f'{self.clock_mode!r}')


class TossRig(Node):
    """
    The simulated toss rig (``sim_driver`` given an ``object``; module docstring).

    :param kwargs: ``rclpy.node.Node`` arguments (``context``, ``parameter_overrides``, ...).
    """

    PARAMETERS = {'': TosserConfig}

    def __init__(self, **kwargs) -> None:
        """Declare parameters, draw the hidden cube, start the clock."""
        super().__init__(kwargs.pop('node_name', 'sim_driver'), **kwargs)
        created = time.monotonic()
        # first, so that destroy_node works on a rig refused half-way
        self._stop = threading.Event()
        self._thread = self._timer = None
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
        self.lockstep = config.clock_mode == 'lockstep'
        refuse_foreign_streams(self, [config.pose_topic], self.lockstep,
                               'The simulated toss rig would publish simulated poses into it',
                               created)
        self.pose_pub = self.create_publisher(PoseStamped, config.pose_topic,
                                              qos_profile_sensor_data)
        truth = self.create_publisher(String, '~/truth', QoSProfile(
            depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL))
        truth.publish(String(data=json.dumps({'half_width': self.box.half_width,
                                              'friction': self.box.friction,
                                              'inertial': list(self.box.inertial)})))
        self.clock_pub = self.create_publisher(ClockMsg, '/clock', 10) if self.lockstep else None
        self.peers = PeerWaiter(self, config.peer_timeout, self.warnings.warn) \
            if self.lockstep else None
        self.published = 0
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
    """Run the node (``ros2 run diffsim_ros sim_driver``); given an ``object``, the toss rig."""
    argv = sys.argv if args is None else args
    run_node(TossRig if object_mode(argv, 'sim_driver') else SimDriver, args)


if __name__ == '__main__':
    main()
