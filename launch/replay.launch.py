"""
Identify a model from a recorded bag and watch its predictions, without commanding anything.

``ros2 launch diffsim_ros replay.launch.py robot:=panda bag:=recording.mcap`` plays the bag
with ``ros2 bag play --clock`` and includes ``identify.launch.py`` with ``control:=false`` and
``use_sim_time:=true``: the identifier refits on the recorded ``joint_states`` and commands,
the monitor compares its rollouts with the recording, RViz shows both.
"""

import os

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration

ROBOTS = ('wam4', 'wam7', 'qube', 'cartpole', 'panda')
IDENTIFY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'identify.launch.py')


def generate_launch_description():
    """Return the bag-replay launch description."""
    play = ExecuteProcess(
        cmd=['ros2', 'bag', 'play', LaunchConfiguration('bag'), '--clock',
             '--rate', LaunchConfiguration('rate')],
        output='screen')
    return LaunchDescription([
        DeclareLaunchArgument('robot', default_value='qube', choices=list(ROBOTS),
                              description='Robot the bag was recorded on; selects '
                                          'config/<robot>.yaml and the URDF.'),
        DeclareLaunchArgument('bag',
                              description='rosbag2 to replay (directory, .mcap or .db3) with '
                                          'joint_states and the command topic.'),
        DeclareLaunchArgument('rate', default_value='1.0',
                              description='Playback rate factor passed to ros2 bag play.'),
        DeclareLaunchArgument('config', default_value='',
                              description='Parameter file overriding config/<robot>.yaml '
                                          '(empty: the installed one).'),
        DeclareLaunchArgument('rviz', default_value='true', choices=['true', 'false'],
                              description='Start RViz with config/monitor.rviz.'),
        IncludeLaunchDescription(
            PythonLaunchDescriptionSource(IDENTIFY),
            launch_arguments={'robot': LaunchConfiguration('robot'),
                              'config': LaunchConfiguration('config'),
                              'rviz': LaunchConfiguration('rviz'),
                              'control': 'false', 'use_sim_time': 'true'}.items()),
        play,
    ])
