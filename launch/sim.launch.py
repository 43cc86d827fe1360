"""
Run the whole identification + adaptive MPC loop against a simulated robot (no hardware).

``ros2 launch diffsim_ros sim.launch.py robot:=qube`` starts ``sim_driver`` (a MuJoCo plant
with "true" parameters that differ from the nominal URDF, publishing ``joint_states`` at the
driver rate and accepting ``/<controller>/commands``; by default in lockstep, publishing
``/clock`` that every node follows with ``use_sim_time``) and includes ``identify.launch.py``
(identifier, monitor, both robot_state_publishers and RViz) for the same robot, with the mpc
controlling the simulated robot (``control:=true`` by default here; ``control:=false``
leaves the robot uncommanded).
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import (DeclareLaunchArgument, IncludeLaunchDescription, OpaqueFunction,
                            Shutdown)
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

PACKAGE = 'diffsim_ros'
#: Why the launch ends when its simulated driver exits (a refused domain: nodes/sim_driver.py).
SIM_DRIVER_EXITED = 'sim_driver exited (it refuses a domain where a robot runs)'
#: Where sim_driver says that its domain probe passed (nodes/foreign_graph.py).
READY_TOPIC = '/sim_driver/ready'
ROBOTS = ('wam4', 'wam7', 'qube', 'cartpole', 'panda')
IDENTIFY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'identify.launch.py')


def _sim_driver(context):
    """
    Start the simulated driver with the robot's parameter file; the launch ends with it.

    It exits at once on a domain where a robot's driver runs (nodes/sim_driver.py); the mpc
    started beside it commands nothing before the driver's ``/sim_driver/ready``, which then
    never comes, and the launch ends.
    """
    robot = LaunchConfiguration('robot').perform(context)
    config = LaunchConfiguration('config').perform(context) or os.path.join(
        get_package_share_directory(PACKAGE), 'config', f'{robot}.yaml')
    lockstep = LaunchConfiguration('lockstep').perform(context).strip().lower() == 'true'
    clock = {'clock_mode': 'lockstep' if lockstep else 'realtime',
             'real_time_factor': float(LaunchConfiguration('real_time_factor').perform(context))}
    return [Node(package=PACKAGE, executable='sim_driver', name='sim_driver', output='screen',
                 parameters=[config, {'robot': robot, 'config_file': config, **clock}],
                 on_exit=Shutdown(reason=SIM_DRIVER_EXITED))]


def generate_launch_description():
    """Return the simulated-robot launch description."""
    return LaunchDescription([
        DeclareLaunchArgument('robot', default_value='qube', choices=list(ROBOTS),
                              description='Robot to simulate, identify and control; selects '
                                          'config/<robot>.yaml and the URDF.'),
        DeclareLaunchArgument('config', default_value='',
                              description='Parameter file overriding config/<robot>.yaml '
                                          '(empty: the installed one).'),
        DeclareLaunchArgument('control', default_value='true', choices=['true', 'false'],
                              description='Start the adaptive MPC node that commands the '
                                          'simulated robot (false: it receives no commands).'),
        DeclareLaunchArgument('rviz', default_value='true', choices=['true', 'false'],
                              description='Start RViz with config/monitor.rviz.'),
        DeclareLaunchArgument('lockstep', default_value='true', choices=['true', 'false'],
                              description='The simulator publishes /clock and every node runs '
                                          'on it (a slow machine slows the simulation instead '
                                          'of desynchronising it); false: wall-clock driver.'),
        DeclareLaunchArgument('real_time_factor', default_value='1.0',
                              description='Lockstep pacing as a multiple of real time; 0 = as '
                                          'fast as the machine can.'),
        OpaqueFunction(function=_sim_driver),
        IncludeLaunchDescription(
            PythonLaunchDescriptionSource(IDENTIFY),
            launch_arguments={'robot': LaunchConfiguration('robot'),
                              'config': LaunchConfiguration('config'),
                              'control': LaunchConfiguration('control'),
                              'rviz': LaunchConfiguration('rviz'),
                              'use_sim_time': LaunchConfiguration('lockstep'),
                              # no command before the driver's probe has passed
                              'start_after': READY_TOPIC}.items()),
    ])
