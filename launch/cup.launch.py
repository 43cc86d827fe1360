"""
Ball in a cup on the WAM-4: identify the arm and the string, track a swing-up (issue 18).

``ros2 launch diffsim_ros cup.launch.py`` (no hardware) starts ``sim_driver`` in its cup scene
(a MuJoCo WAM-4 with a cup and a ball on a string: a length-limiting tendon plus a light
capsule chain, ``sim.cup.StringBuild``; hidden parameters drawn from its ``seed``;
``/joint_states`` and the ball on ``/mocap/ball`` at 500 Hz; in lockstep by default,
publishing ``/clock``), the ``identifier`` in its cup mode (the arm from
``joint_states``, the string from the ball's poses: ``/identifier/parameters`` carries
``string/string_length`` and the cup transform with their std) and, with
``reference_file:=<swing_up.yaml>`` (a ``kind: sampled`` file; ``diffsim-cup-search`` makes one
from identification data), the ``mpc`` tracking it with the computed-torque baseline;
``/sim_driver/ball_in_cup`` says whether the ball ended in the cup.
Every node reads ``config/wam4_cup.yaml`` (its joint speed limits and why are there).

On a physical WAM, with its driver publishing ``/joint_states`` and taking
``/effort_controller/commands`` and a tracker publishing the ball on ``/mocap/ball``:
``simulate:=false``.
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction, Shutdown
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

PACKAGE = 'diffsim_ros'
#: Why the launch ends when its simulated driver exits (a refused domain: nodes/sim_driver.py).
SIM_DRIVER_EXITED = 'sim_driver exited (it refuses a domain where a robot runs)'
#: Where sim_driver says that its domain probe passed (nodes/foreign_graph.py).
READY_TOPIC = '/sim_driver/ready'
#: The one robot configuration this experiment runs (the WAM-4 with the cup).
CONFIG = 'wam4_cup.yaml'


def _flag(context, name: str) -> bool:
    return LaunchConfiguration(name).perform(context).strip().lower() == 'true'


def _nodes(context):
    """Start the simulated cup (when simulated), the identifier and the mpc."""
    config = LaunchConfiguration('config').perform(context) or os.path.join(
        get_package_share_directory(PACKAGE), 'config', CONFIG)
    simulate = _flag(context, 'simulate')
    lockstep = simulate and _flag(context, 'lockstep')
    common = {'config_file': config, 'use_sim_time': lockstep}
    nodes = [Node(package=PACKAGE, executable='identifier', name='identifier',
                  output='screen', parameters=[config, common])]
    reference = LaunchConfiguration('reference_file').perform(context)
    if reference:
        # simulated: no command before the driver's domain probe has passed
        mpc = {**common, 'reference_file': reference,
               'start_after': READY_TOPIC if simulate else ''}
        nodes.append(Node(package=PACKAGE, executable='mpc', name='mpc', output='screen',
                          parameters=[config, mpc]))
    if simulate:
        driver = {'config_file': config,
                  'clock_mode': 'lockstep' if lockstep else 'realtime',
                  'real_time_factor': float(LaunchConfiguration('real_time_factor')
                                            .perform(context)),
                  'seed': int(LaunchConfiguration('seed').perform(context))}
        # the launch ends with it: it refuses a domain where a robot runs, and the mpc
        # would otherwise wait for its ready there (nodes/sim_driver.py)
        nodes.append(Node(package=PACKAGE, executable='sim_driver', name='sim_driver',
                          output='screen', parameters=[config, driver],
                          on_exit=Shutdown(reason=SIM_DRIVER_EXITED)))
    return nodes


def generate_launch_description():
    """Return the ball-in-a-cup launch description."""
    return LaunchDescription([
        DeclareLaunchArgument('config', default_value='',
                              description='Parameter file overriding config/wam4_cup.yaml '
                                          '(empty: the installed one).'),
        DeclareLaunchArgument('reference_file', default_value='',
                              description='A kind: sampled swing-up (or an excitation.yaml) '
                                          'the mpc tracks; empty: no mpc, nothing commanded.'),
        DeclareLaunchArgument('simulate', default_value='true', choices=['true', 'false'],
                              description='Start the simulated WAM with the cup and the ball '
                                          '(false: the physical robot and a ball tracker).'),
        DeclareLaunchArgument('seed', default_value='0',
                              description='Simulated cup only: seed of the hidden plant.'),
        DeclareLaunchArgument('lockstep', default_value='true', choices=['true', 'false'],
                              description='Simulated cup only: it publishes /clock and every '
                                          'node runs on it (false: wall clock).'),
        DeclareLaunchArgument('real_time_factor', default_value='1.0',
                              description='Lockstep pacing as a multiple of real time; 0 = as '
                                          'fast as the nodes allow.'),
        OpaqueFunction(function=_nodes),
    ])
