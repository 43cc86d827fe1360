"""
Identify robot dynamics with differentiable simulation and control robots with adaptive MPC.

Layers, dependencies pointing down only: ``nodes`` (the only ROS 2 code) > ``io`` >
``control`` > ``sysid`` > ``core`` (torch only); ``robots`` holds the robot descriptions and
``sim`` the MuJoCo plant.  Frames, units and batching: docs/conventions.md.
"""

__version__ = '0.1.0'
