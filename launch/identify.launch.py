"""
Identify a robot online, with RViz showing the prediction; control it only when asked.

``ros2 launch diffsim_ros identify.launch.py robot:=qube`` against the robot's real driver
(a ros2_control forward command controller on ``/<controller>/commands`` and a
``joint_states`` publisher).  Nothing is sent to the robot unless ``control:=true``: the
default identifies from whatever moves the robot (its own controller, a teleoperator).
Starts:

* ``identifier``: refits the model from ``joint_states`` and the commands it sees and
  publishes it whole on ``/identifier/model`` (the mpc's and monitor's input) and as URDF on
  ``/identifier/robot_description``;
* ``mpc``, only with ``control:=true``: commands the robot with adaptive MPC on the newest
  model;
* ``monitor``: rolls the model forward over recorded commands, publishes the ghost's
  ``/predicted/joint_states``, end-effector paths on ``/monitor/markers`` and the NMSE;
* two ``robot_state_publisher``: the measured robot, and the ghost (namespace ``predicted``,
  ``frame_prefix: predicted/``) fed by ``/predicted/joint_states``, tied to the base link
  by a static transform;
* ``rviz2`` with ``config/monitor.rviz`` (``rviz:=false`` leaves it out).

Parameters come from ``config/<robot>.yaml`` (or ``config:=<file>``); ``model_file:=<fit>``
(a ``diffsim-fit --out`` folder or its ``params.yaml``) gives the identifier, the mpc and the
monitor an offline fit, friction module included, as their starting model.  ``sim.launch.py`` and
``replay.launch.py`` include this file.
"""

import os

from ament_index_python.packages import get_package_share_directory
from diffsim_ros import robots
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

PACKAGE = 'diffsim_ros'
ROBOTS = ('wam4', 'wam7', 'qube', 'cartpole', 'panda')
PREDICTED_PREFIX = 'predicted/'


def _flag(context, name):
    """Return a boolean launch argument as a Python bool."""
    return LaunchConfiguration(name).perform(context).strip().lower() in ('true', '1', 'yes')


def _nodes(context):
    """Build the node graph once the robot and flags are known."""
    share = get_package_share_directory(PACKAGE)
    robot = LaunchConfiguration('robot').perform(context)
    info = robots.get(robot)
    config = LaunchConfiguration('config').perform(context) or os.path.join(
        share, 'config', f'{robot}.yaml')
    common = {'use_sim_time': _flag(context, 'use_sim_time')}
    model_file = LaunchConfiguration('model_file').perform(context)
    fit = {'model_file': os.path.abspath(os.path.expanduser(model_file))} if model_file else {}
    params = [config, {'robot': robot, 'config_file': config, **fit, **common}]
    urdf = robots.urdf_string(robot)
    actions = [
        Node(package=PACKAGE, executable='identifier', name='identifier', output='screen',
             parameters=params),
        Node(package=PACKAGE, executable='monitor', name='monitor', output='screen',
             parameters=params),
        Node(package='robot_state_publisher', executable='robot_state_publisher',
             name='robot_state_publisher', output='log',
             parameters=[{'robot_description': urdf, **common}]),
        Node(package='robot_state_publisher', executable='robot_state_publisher',
             name='robot_state_publisher', namespace='predicted', output='log',
             parameters=[{'robot_description': urdf, 'frame_prefix': PREDICTED_PREFIX,
                          **common}]),
        Node(package='tf2_ros', executable='static_transform_publisher',
             name='predicted_base_tf', output='log',
             arguments=['--frame-id', info.base_link,
                        '--child-frame-id', PREDICTED_PREFIX + info.base_link],
             parameters=[common]),
    ]
    if _flag(context, 'control'):   # the only node that commands the robot
        start_after = LaunchConfiguration('start_after').perform(context)
        actions.append(Node(package=PACKAGE, executable='mpc', name='mpc', output='screen',
                            parameters=[*params, {'start_after': start_after}]))
    if _flag(context, 'rviz'):
        actions.append(Node(
            package='rviz2', executable='rviz2', name='rviz2', output='log',
            arguments=['-d', os.path.join(share, 'config', 'monitor.rviz'),
                       '--fixed-frame', info.base_link],
            parameters=[common]))
    return actions


def generate_launch_description():
    """Return the identification + monitor (+ MPC with control:=true) launch description."""
    return LaunchDescription([
        DeclareLaunchArgument('robot', default_value='qube', choices=list(ROBOTS),
                              description='Robot to identify and control; selects '
                                          'config/<robot>.yaml and the URDF.'),
        DeclareLaunchArgument('config', default_value='',
                              description='Parameter file overriding config/<robot>.yaml '
                                          '(empty: the installed one).'),
        DeclareLaunchArgument('model_file', default_value='',
                              description='A diffsim-fit --out folder (or its params.yaml) '
                                          'the identifier, mpc and monitor start from instead '
                                          'of the catalogue model (empty: the catalogue).'),
        DeclareLaunchArgument('use_sim_time', default_value='false', choices=['true', 'false'],
                              description='Use /clock (bag replay or simulation) instead of '
                                          'the wall clock.'),
        DeclareLaunchArgument('control', default_value='false', choices=['true', 'false'],
                              description='true: also start the adaptive MPC node, which '
                                          'sends commands to the robot; false (default): '
                                          'identify and monitor only, commanding nothing.'),
        DeclareLaunchArgument('start_after', default_value='',
                              description='With control:=true: the mpc commands nothing before '
                                          'a message on this topic (sim.launch.py: the '
                                          "simulated driver's /sim_driver/ready); empty: from "
                                          'the start.'),
        DeclareLaunchArgument('rviz', default_value='true', choices=['true', 'false'],
                              description='Start RViz with config/monitor.rviz (measured and '
                                          'predicted robot, end-effector paths).'),
        OpaqueFunction(function=_nodes),
    ])
