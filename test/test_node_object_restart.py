"""
The identifier's object mode over real DDS when time starts over, and its services.

A probe publishes synthetic tosses on a private topic (no straggler of another test reaches
it), paced in wall time where the timeline rule counts on the node's clock; ``~/reset`` and
``~/save`` are called as a user calls them.  Nothing here counts best-effort deliveries.
"""

from dataclasses import replace
import math
import time

from diagnostic_msgs.msg import DiagnosticArray
from diffsim_ros.io.object_urdf import read_object_urdf
from diffsim_ros.nodes.convert import pose_msg, sec_to_stamp
from diffsim_ros.nodes.object_identifier import ObjectIdentifier
from diffsim_ros.nodes.params import parameter_overrides
from diffsim_ros.sysid.contact_learning import ObjectFit
from diffsim_ros.sysid.object_online import object_parameters, ObjectResult
from geometry_msgs.msg import PoseStamped
import numpy as np
import pytest
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, qos_profile_sensor_data, QoSProfile
from ros_helpers import call, settled, wait_for
from std_msgs.msg import String
from std_srvs.srv import Trigger
import torch
import yaml

pytest_plugins = ['ros_helpers']
pytestmark = pytest.mark.ros

TOPIC = '/restart_test/mocap/cube'
DT = 1.0 / 148.0
REST_Z = 0.0524   # the nominal cube's half width: lying on the ground


def motion(rest_before: float, flight: float = 0.0, rest_after: float = 0.0):
    """Return ``(t from 0, x, z)`` samples: at rest, a toss (vx 0.3, vz 1.6 m/s), at rest."""
    samples, x, t = [], 0.0, 0.0
    for _ in range(int(rest_before / DT)):
        samples.append((t, x, REST_Z))
        t += DT
    start = t
    while t - start < flight:
        tau = t - start
        z = REST_Z + 1.6 * tau - 4.905 * tau ** 2
        if z < REST_Z:   # landed
            break
        samples.append((t, x + 0.3 * tau, z))
        t += DT
    x += 0.3 * (t - start)
    for _ in range(int(rest_after / DT)):
        samples.append((t, x, REST_Z))
        t += DT
    return samples


def publish(publisher, samples, t0: float, pace: bool) -> None:
    """Publish ``samples`` stamped ``t0 + t``, at the samples' rate when ``pace``."""
    for t, x, z in samples:
        T = np.eye(4)
        T[:3, 3] = (x, 0.0, z)
        publisher.publish(pose_msg(T, 'world', sec_to_stamp(t0 + t)))
        time.sleep(DT if pace else 0.002)


def start(executor, **params):
    """Start the object identifier on the private topic and a probe; return both and inbox."""
    context = executor.executor.context
    node = executor.add_node(ObjectIdentifier(context=context, parameter_overrides=(
        parameter_overrides({'pose_topic': TOPIC, 'diagnostics_period': 0.2,
                             'refit.execution': 'thread', **params}))))
    probe = executor.add_node(Node('restart_probe', context=context))
    inbox = {'diagnostics': [], 'description': []}
    probe.create_subscription(DiagnosticArray, '/diagnostics', inbox['diagnostics'].append, 10)
    probe.create_subscription(String, '/identifier/robot_description',
                              inbox['description'].append,
                              QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL))
    publisher = probe.create_publisher(PoseStamped, TOPIC, qos_profile_sensor_data)
    assert wait_for(lambda: publisher.get_subscription_count() > 0, timeout=10.0)
    return node, probe, publisher, inbox


def diagnosed(inbox, key: str, value: str) -> bool:
    """Return whether a /diagnostics message of the object identifier reported key=value."""
    for msg in list(inbox['diagnostics']):
        for status in msg.status:
            values = {kv.key: kv.value for kv in status.values}
            if 'object identification' in status.name and values.get(key) == value:
                return True
    return False


def test_a_stream_that_starts_over_is_adopted_and_no_toss_spans_the_restart(executor):
    node, probe, publisher, inbox = start(executor)
    gate, segmenter = node.gate, node.segmenter
    # the old timeline: at rest, then released; the stream stops in flight (a sim reset)
    old_t0 = node.get_clock().now().nanoseconds * 1e-9 - 5.0
    publish(publisher, motion(0.2, flight=0.12), old_t0, pace=False)
    assert wait_for(lambda: segmenter.in_toss, timeout=20.0), segmenter.counts
    settled(lambda: gate.accepted)
    old_last = gate.last_stamp_ns
    # the new timeline starts at 100 s, far behind: first the cube lying where the reset put
    # it (refused as stamp_back until the old stream has been silent for resync_time and
    # resync_messages poses have come), then one whole toss
    new_t0 = 100.0
    publish(publisher, motion(1.2, flight=1.0, rest_after=0.5), new_t0, pace=True)
    assert wait_for(lambda: segmenter.counts['tosses'] == 1, timeout=30.0), segmenter.counts
    assert gate.refused['stamp_back'] >= 1 and gate.timeline.restarts == 1, gate.values()
    assert gate.last_stamp_ns < old_last and node.warnings.drops[f'{TOPIC}/restart'] == 1
    # the toss in flight at the restart was dropped, not glued to the new timeline's poses
    assert segmenter.counts['aborted_restart'] == 1
    assert len(node.engine.tosses) == 1
    toss = node.engine.tosses[0]
    assert float(toss.t[0]) > new_t0 + 1.0 and float(toss.t[-1]) < new_t0 + 3.0
    assert bool((toss.t[1:] > toss.t[:-1]).all())
    assert wait_for(lambda: diagnosed(inbox, 'timeline_restarts', '1') and
                    diagnosed(inbox, 'toss/aborted_restart', '1'), timeout=10.0)


def test_reset_and_save_services_write_the_object_in_use(executor, tmp_path):
    node, probe, publisher, inbox = start(executor, save_directory=str(tmp_path / 'saved'))
    spec = node.spec
    # the object in use: a learned shape that is no box (one corner pulled out), friction 0.3
    vertices = spec.contact.vertices[0].clone() * torch.tensor([1.2, 1.0, 0.9],
                                                               dtype=torch.float64)
    vertices[0] += torch.tensor([-0.01, -0.004, -0.006], dtype=torch.float64)
    contact = replace(spec.contact, vertices=(vertices,),
                      friction=torch.tensor(0.3, dtype=torch.float64))
    fit = ObjectFit('ccn', spec, spec.model, contact, {})
    node.engine.current = ObjectResult(fit, object_parameters(spec.model, contact),
                                       {'friction': 0.02})
    publish(publisher, motion(0.2, flight=0.12), node.get_clock().now().nanoseconds * 1e-9
            - 5.0, pace=False)
    assert wait_for(lambda: node.segmenter.in_toss, timeout=20.0)

    saved = call(probe, Trigger, '/identifier/save', Trigger.Request())
    assert saved.success, saved.message
    urdf = tmp_path / 'saved' / 'cube_identified.urdf'
    assert str(urdf) in saved.message and (tmp_path / 'saved' / 'cube_identified_cube.obj')
    model, learned, name = read_object_urdf(urdf)
    assert torch.allclose(learned.vertices[0], vertices, atol=1e-12)
    assert float(learned.friction) == pytest.approx(0.3)
    assert float(model.inertial.reshape(-1)[0]) == pytest.approx(0.37)
    document = yaml.safe_load((tmp_path / 'saved' / 'cube_identified.yaml').read_text())
    assert document['object'] == 'cube' and document['method'] == 'ccn'
    assert document['parameters']['friction'] == {'value': pytest.approx(0.3), 'unit': '',
                                                  'std': 0.02}

    reset = call(probe, Trigger, '/identifier/reset', Trigger.Request())
    assert reset.success, reset.message
    assert node.engine.current is None and not node.segmenter.in_toss
    assert not node.engine.tosses and not node.engine.snapshots
    # the nominal box is published again (a learned non-box shape carries its bounds)
    assert wait_for(lambda: inbox['description'] and
                    'learned_bounds' not in inbox['description'][-1].data, timeout=10.0)
    again = call(probe, Trigger, '/identifier/save', Trigger.Request())
    assert again.success, again.message
    _, nominal, _ = read_object_urdf(urdf)
    extent = nominal.vertices[0].max(0).values - nominal.vertices[0].min(0).values
    assert torch.allclose(extent, torch.full((3,), 2 * REST_Z, dtype=torch.float64))
    assert float(nominal.friction) == pytest.approx(float(spec.contact.friction))
    document = yaml.safe_load((tmp_path / 'saved' / 'cube_identified.yaml').read_text())
    assert document['method'] == 'nominal' and 'std' not in document['parameters']['friction']
    assert math.isclose(document['parameters']['size_x']['value'], 2 * REST_Z)
