"""
The ROS 2 nodes of diffsim_ros: the only layer that imports rclpy and message packages.

* :mod:`.convert` - message <-> array conversion with validation, throttled warnings.
* :mod:`.params` - declared ROS parameters <-> frozen config dataclasses, per-robot YAML.
* :mod:`.sim_driver` - the MuJoCo plant behind a real driver's topics (executable
  ``sim_driver``).
* :mod:`.identifier` - online identification node (executable ``identifier``).

Other nodes (monitor, mpc, recorder) live beside these.  Submodules are imported on demand
so that ``import diffsim_ros.nodes`` stays cheap.
"""
