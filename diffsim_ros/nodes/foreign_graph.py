"""
Refusing a DDS domain where another robot's graph already runs.

A simulated robot publishes what a real robot's driver publishes (``joint_states``, mocap
poses, ``/clock`` in lockstep) and takes what a real driver takes (the command topic).  On
a domain that already carries a real robot (this machine, or the lab's network where
discovery reaches it) the simulated states would reach the real robot's controllers and
the real states the simulated graph, and the simulated graph's commands the real driver.
So before a simulated robot publishes anything, it listens on its domain for up to
:data:`FOREIGN_PROBE_S` seconds (DDS discovery of whatever already runs there) and refuses
to start as soon as it finds someone else publishing or taking the streams its caller names
(:func:`refuse_foreign_graph`).  Two users: ``diffsim-demo`` (before any of its nodes
exist) and the ``sim_driver`` node (before it creates its publishers).

A launch starts its nodes together: the mpc of a simulated graph would command whatever
robot publishes ``joint_states`` during the driver's probe.  So the driver says when the
probe has passed, on ``~/ready`` (``std_msgs/Empty``, :data:`READY_QOS`), and a simulated
launch's mpc sends no command before it has heard that (its ``start_after`` parameter).

The other way round, a process that needs a domain of its own (a test run, a benchmark)
claims a quiet one with :func:`claim_quiet_domain`: it listens there with a node of its own
and keeps that node alive while it uses the domain, so that a later claimant, in whatever
container or temporary directory, hears it and goes elsewhere.
"""

import os
import random
import secrets
import time
from typing import Callable, Iterable, List, Optional

from rclpy.qos import DurabilityPolicy, QoSProfile

__all__ = ['DomainClaim', 'FOREIGN_PROBE_S', 'ForeignGraphError', 'POLL_S', 'READY_QOS',
           'UNKNOWN_NODE', 'claim_a_quiet_domain', 'claim_quiet_domain', 'domain_occupants',
           'foreign_endpoints', 'refuse_foreign_graph']

#: Wall seconds at most to listen on a domain before a simulated robot starts: DDS discovery
#: of whatever already runs there.  A new Fast DDS participant (the default rmw) found one
#: already running on loopback within 0.1-0.7 s in 25 of 38 starts, but in 13 only after
#: 1.1-3.1 s (the existing participant's next announcement: every 3 s), with and without
#: ``ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST``; 1.5 s missed 11 of them.  One announcement
#: period and a margin for a busy machine.
FOREIGN_PROBE_S = 4.0
#: QoS of a simulated driver's ``~/ready``: latched, so an mpc that starts later hears it.
READY_QOS = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
#: Wall seconds between two looks at the graph while listening.
POLL_S = 0.05
#: The node name of an endpoint whose node the graph does not know yet (rmw_dds_common's:
#: DDS discovered the endpoint, the ROS graph information naming its node has not come).
UNKNOWN_NODE = '_NODE_NAME_UNKNOWN_'


class ForeignGraphError(RuntimeError):
    """Another graph on the domain publishes or takes a simulated robot's streams."""


def _label(name: str, namespace: str) -> str:
    """Return a graph node's ``namespace/name``, or what is said of one not yet named."""
    return 'a node not yet named' if name == UNKNOWN_NODE else f'{namespace.rstrip("/")}/{name}'


def _names(endpoints) -> str:
    """Return the ``namespace/name`` of the nodes behind graph endpoints, sorted, unique."""
    return ', '.join(sorted({_label(e.node_name, e.node_namespace) for e in endpoints}))


def foreign_endpoints(node, publishers: Iterable[str] = (), subscribers: Iterable[str] = (),
                      wait_s: float = FOREIGN_PROBE_S, since: Optional[float] = None
                      ) -> List[str]:
    """
    Listen for the domain's discovery and say who publishes or subscribes the given topics.

    Returns as soon as any is found and the nodes behind what is found are named (the
    others found by then are named too), else after ``wait_s``.  Every endpoint the graph
    knows is counted, the node's own included: call it before the node creates its own
    publishers and subscriptions on these topics.

    :param node: the node whose view of the graph is read (it need not be spun).
    :param publishers: fully qualified topic names whose publishers count.
    :param subscribers: fully qualified topic names whose subscribers count.
    :param wait_s: how long discovery is given [s].
    :param since: ``time.monotonic()`` when the node (and with it its DDS participant) was
        created: the time since counts towards ``wait_s``; ``None`` = now.
    :return: one entry per topic that has any, e.g.
        ``'publishers of /joint_states: /lab/qube_driver'``; empty when there are none.
    """
    publishers, subscribers = list(publishers), list(subscribers)
    deadline = (time.monotonic() if since is None else since) + wait_s
    while True:
        found = [('publishers', topic, node.get_publishers_info_by_topic(topic))
                 for topic in publishers]
        found += [('subscribers', topic, node.get_subscriptions_info_by_topic(topic))
                  for topic in subscribers]
        named = all(e.node_name != UNKNOWN_NODE for _, _, endpoints in found
                    for e in endpoints)
        found = [f'{kind} of {topic}: {_names(endpoints)}'
                 for kind, topic, endpoints in found if endpoints]
        left = deadline - time.monotonic()
        if (found and named) or left <= 0.0:
            return found
        time.sleep(min(POLL_S, left))


def refuse_foreign_graph(node, publishers: Iterable[str] = (), subscribers: Iterable[str] = (),
                         harm: str = '', remedy: str = '', wait_s: float = FOREIGN_PROBE_S,
                         since: Optional[float] = None) -> None:
    """
    Refuse to start a simulated robot on a domain where another graph has its streams.

    Listens as :func:`foreign_endpoints` does.

    :param node: the node whose view of the graph is read, before it has endpoints of its
        own on these topics.
    :param publishers: fully qualified topic names on which any publisher is foreign.
    :param subscribers: fully qualified topic names on which any subscriber is foreign.
    :param harm: what the simulated robot would do there (a sentence without its full stop).
    :param remedy: how to run it on a free domain.
    :param wait_s: how long discovery is given [s].
    :param since: ``time.monotonic()`` when the node was created; ``None`` = now.
    :raises ForeignGraphError: naming the domain, the topics and the nodes on them, what
        would happen and the remedy.
    """
    found = foreign_endpoints(node, publishers, subscribers, wait_s, since)
    if found:
        raise ForeignGraphError(
            'another ROS graph runs on this domain (ROS_DOMAIN_ID '
            f'{node.context.get_domain_id()}): ' + '; '.join(found) + f'. {harm}; {remedy}')


def domain_occupants(node) -> List[str]:
    """
    Say which other nodes (and endpoints of nodes not yet named) ``node`` has discovered.

    :param node: the node whose view of the graph is read.
    :return: ``namespace/name`` of every other node, and ``'a node not yet named'`` when
        an endpoint's node is not known yet; sorted, unique; empty when it is alone.
    """
    own = (node.get_name(), node.get_namespace())
    found = set(map(tuple, node.get_node_names_and_namespaces()))
    for topic, _ in node.get_topic_names_and_types():
        found.update((e.node_name, e.node_namespace)
                     for e in (node.get_publishers_info_by_topic(topic)
                               + node.get_subscriptions_info_by_topic(topic)))
    return sorted({_label(*key) for key in found - {own}})


class DomainClaim:
    """A node that holds a DDS domain for its process: :func:`claim_quiet_domain`."""

    def __init__(self, domain: int, context, node) -> None:
        """Hold ``domain`` with ``node`` of ``context`` (both made by the claim)."""
        self.domain, self.context, self.node = domain, context, node

    def release(self) -> None:
        """Destroy the node and shut its context down; the domain is free for others."""
        if self.node is not None:
            self.node.destroy_node()
            self.node = None
        self.context.try_shutdown()


def claim_quiet_domain(domain: int, wait_s: float = FOREIGN_PROBE_S,
                       name: str = 'domain_claim') -> Optional[DomainClaim]:
    """
    Listen on ``domain`` and keep it when no other node is there.

    A file lock or a pid-derived id only keeps apart the processes that share a temporary
    directory and a pid space; two containers on one host share loopback DDS and neither.
    Listening does not: it hears every participant discovery reaches.  The claim's node
    stays on the domain (no endpoints but ``/parameter_events``) until released, so that
    a later claimant hears it and goes elsewhere.

    :param domain: the DDS domain id (0-232 for Fast DDS's port arithmetic).
    :param wait_s: how long discovery is given [s]; :data:`FOREIGN_PROBE_S` covers one
        announcement period of an already running participant.
    :param name: the claim node's name; the process id and a random token are appended.
    :return: the claim, or ``None`` when another node is on the domain (the listening
        node is gone again).
    """
    import rclpy
    from rclpy.context import Context

    context = Context()
    rclpy.init(context=context, domain_id=domain)
    try:
        node = rclpy.create_node(f'{name}_{os.getpid()}_{secrets.token_hex(3)}',
                                 context=context, enable_rosout=False,
                                 start_parameter_services=False)
    except Exception:
        context.try_shutdown()
        raise
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if domain_occupants(node):
            DomainClaim(domain, context, node).release()
            return None
        time.sleep(POLL_S)
    return DomainClaim(domain, context, node)


def claim_a_quiet_domain(ids: Iterable[int], wait_s: float = FOREIGN_PROBE_S,
                         name: str = 'domain_claim',
                         admit: Optional[Callable[[int], bool]] = None) -> DomainClaim:
    """
    Claim the first quiet id of ``ids``, tried in a random order (:func:`claim_quiet_domain`).

    A random order, because processes that count from the same start (small pids in two
    containers) would otherwise meet on the same ids.

    :param ids: the candidate domain ids.
    :param wait_s: how long to listen on each [s].
    :param name: the claim node's name (see :func:`claim_quiet_domain`).
    :param admit: asked first for each id; ``False`` skips it without listening (a test run
        holding a lock file on it, say).
    :return: the claim.
    :raises ForeignGraphError: when no id is quiet, naming those with nodes on them.
    """
    ids = list(ids)
    occupied, skipped = [], 0
    for domain in random.SystemRandom().sample(ids, len(ids)):
        if admit is not None and not admit(domain):
            skipped += 1
            continue
        claim = claim_quiet_domain(domain, wait_s, name)
        if claim is not None:
            return claim
        occupied.append(domain)
    raise ForeignGraphError(f'no quiet DDS domain among {len(ids)} ids: nodes on '
                            f'{sorted(occupied)}' + (f', {skipped} not admitted' if skipped
                                                     else ''))
