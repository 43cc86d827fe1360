"""
Learn a tossed object from its motion-capture topic: the identifier's object mode.

``ros2 launch diffsim_ros object.launch.py`` (no hardware) starts ``sim_driver`` in its
object mode (a MuJoCo cube with hidden size, friction and inertia, tossed again and again,
its pose published at 148 Hz on ``/mocap/cube``; in lockstep by default, publishing
``/clock``) and the ``identifier`` in its object mode (``object:=cube``: cuts tosses, refits,
publishes
``/identifier/robot_description`` and ``/identifier/parameters``), both with
``config/cube.yaml``.  On the real rig,
``simulate:=false pose_topic:=/vrpn_mocap/<tracker>/pose`` starts the identifier alone on
the tracker's topic.
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
OBJECTS = ('cube',)


def _nodes(context):
    """Start the rig (when simulated) and the identifier with the object's parameter file."""
    name = LaunchConfiguration('object').perform(context)
    config = LaunchConfiguration('config').perform(context) or os.path.join(
        get_package_share_directory(PACKAGE), 'config', f'{name}.yaml')
    simulate = LaunchConfiguration('simulate').perform(context).strip().lower() == 'true'
    lockstep = simulate and \
        LaunchConfiguration('lockstep').perform(context).strip().lower() == 'true'
    topic = LaunchConfiguration('pose_topic').perform(context)
    identifier = {'object': name, 'config_file': config, 'use_sim_time': lockstep,
                  **({'pose_topic': topic} if topic else {})}
    nodes = [Node(package=PACKAGE, executable='identifier', name='identifier',
                  output='screen', parameters=[config, identifier])]
    if simulate:
        rig = {'object': name, 'config_file': config,
               'clock_mode': 'lockstep' if lockstep else 'realtime',
               'real_time_factor': float(LaunchConfiguration('real_time_factor')
                                         .perform(context)),
               **({'pose_topic': topic} if topic else {})}
        # the launch ends with it (it refuses a domain where a pose topic has a publisher)
        nodes.append(Node(package=PACKAGE, executable='sim_driver', name='sim_driver',
                          output='screen', parameters=[config, rig],
                          on_exit=Shutdown(reason=SIM_DRIVER_EXITED)))
    return nodes


def generate_launch_description():
    """Return the object-learning launch description."""
    return LaunchDescription([
        DeclareLaunchArgument('object', default_value='cube', choices=list(OBJECTS),
                              description='Tracked object; selects config/<object>.yaml.'),
        DeclareLaunchArgument('config', default_value='',
                              description='Parameter file overriding config/<object>.yaml '
                                          '(empty: the installed one).'),
        DeclareLaunchArgument('simulate', default_value='true', choices=['true', 'false'],
                              description='Start the simulated toss rig (false: a real '
                                          'tracker publishes the poses).'),
        DeclareLaunchArgument('pose_topic', default_value='',
                              description="The object's PoseStamped topic (empty: the "
                                          "config's, /mocap/cube)."),
        DeclareLaunchArgument('lockstep', default_value='true', choices=['true', 'false'],
                              description='Simulated rig only: it publishes /clock and the '
                                          'identifier runs on it, holding the rig while it '
                                          'refits (false: wall clock).'),
        DeclareLaunchArgument('real_time_factor', default_value='1.0',
                              description='Lockstep pacing as a multiple of real time; 0 = as '
                                          'fast as the identifier takes the poses.'),
        OpaqueFunction(function=_nodes),
    ])
