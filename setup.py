"""Install diffsim_ros as an ament_python package (colcon) or with pip."""

from glob import glob
import os

from setuptools import find_packages
from setuptools import setup

package_name = 'diffsim_ros'


def _files(pattern: str) -> list:
    """Return the regular files matching a glob pattern, sorted, without the READMEs."""
    return sorted(path for path in glob(pattern)
                  if os.path.isfile(path) and os.path.basename(path) != 'README.md')


setup(
    name=package_name,
    version='0.1.0',
    packages=find_packages(exclude=['test', 'test.*', 'benchmarks', 'benchmarks.*']),
    package_data={'diffsim_ros.robots': ['urdf/*.urdf'], 'diffsim_ros.core': ['native/*.cpp']},
    data_files=[
        ('share/ament_index/resource_index/packages', ['resource/' + package_name]),
        ('share/' + package_name, ['package.xml']),
        (os.path.join('share', package_name, 'launch'), _files('launch/*.py')),
        (os.path.join('share', package_name, 'config'), _files('config/*')),
    ],
    # Runtime dependencies (torch, numpy, scipy, rclpy, ...) come from package.xml
    # (rosdep) or from scripts/dev.sh; listing torch here would let pip pull a CUDA build.
    install_requires=['setuptools'],
    zip_safe=False,
    maintainer='diffsim_ros maintainers',
    maintainer_email='diffsim-ros@example.org',
    description='Online identification of robot dynamics with differentiable simulation '
                'and adaptive MPC, as ROS 2 nodes.',
    license='Apache-2.0',
    python_requires='>=3.10',
    entry_points={
        'console_scripts': [
            'diffsim-cup-search = diffsim_ros.cup_search:main',
            'diffsim-demo = diffsim_ros.demo:main',
            'diffsim-excite = diffsim_ros.io.excite_cli:main',
            'diffsim-fit = diffsim_ros.io.fit_cli:main',
            'diffsim-predict = diffsim_ros.io.predict_cli:main',
            'diffsim-sim-eval = diffsim_ros.sim_eval:main',
            # ROS 2 executables (ros2 run diffsim_ros <name>)
            'identifier = diffsim_ros.nodes.identifier:main',
            'monitor = diffsim_ros.nodes.monitor:main',
            'mpc = diffsim_ros.nodes.mpc:main',
            'object_identifier = diffsim_ros.nodes.object_identifier:main',
            'sim_driver = diffsim_ros.nodes.sim_driver:main',
        ],
    },
)
