"""
Sets of reference trajectories: sum keeps one posterior mode per reference, product merges.

CSVGD (Heiden et al., ICRA 2022) appendix figure 1: two trajectories of a simulated double
pendulum whose first links differ in length.  With ``combine='sum'`` (equal-weight mixture of
the per-trajectory likelihoods) SVGD particles on the link length settle near both true
lengths; with ``combine='product'`` every particle must explain both trajectories at once and
they collapse to one compromise length between them.
"""

from diffsim_ros.sysid import double_pendulum as dp
from diffsim_ros.sysid.likelihoods import SingleShooting
from diffsim_ros.sysid.svgd import sobol_particles, SVGD
import pytest
import torch

F64 = torch.float64
DT = 0.01
STEPS = 40
LENGTHS = (0.08, 0.12)
LOW, HIGH = 0.05, 0.15
#: Index of ``link_1/length`` in the 11 parameters.
L1 = dp.PARAMETER_NAMES.index('link_1/length')


class LinkLengthSimulator:
    """The IBM pendulum model with every parameter nominal except the first link length."""

    def __init__(self) -> None:
        """Wrap the closed-form simulator at 100 Hz."""
        self.simulator = dp.DoublePendulumSimulator(DT)
        self.params_to_model = None
        self.nominal = torch.tensor(dp.NOMINAL, dtype=F64)

    def simulate(self, params: torch.Tensor, x0: torch.Tensor,
                 controls: torch.Tensor) -> torch.Tensor:
        """Simulate link lengths ``(P, 1)``, see ``TrajectorySimulator.simulate``."""
        physical = self.nominal.expand(params.shape[0], -1)
        physical = torch.cat((physical[:, :L1], params, physical[:, L1 + 1:]), -1)
        return self.simulator.simulate_physical(physical, x0, controls.shape[-2])


@pytest.fixture(scope='module')
def references():
    simulator = LinkLengthSimulator()
    x0 = torch.tensor([[1.2, -0.4, 0.0, 0.0]], dtype=F64)
    lengths = torch.tensor(LENGTHS, dtype=F64)[:, None]
    states = simulator.simulate(lengths, x0, torch.zeros(1, STEPS, 1))
    return simulator, states            # (2, STEPS + 1, 4), one per link length


def _fit(references, combine: str) -> torch.Tensor:
    simulator, states = references
    likelihood = SingleShooting(simulator, states, torch.zeros(STEPS, 1, dtype=F64),
                                sigma=torch.tensor([0.02, 0.02, 0.2, 0.2], dtype=F64),
                                combine=combine, param_low=torch.tensor([LOW], dtype=F64),
                                param_high=torch.tensor([HIGH], dtype=F64))
    initial = likelihood.pack(sobol_particles(40, [0.055], [0.145], seed=3))
    result = SVGD('rbf', 'adagrad', lr=0.1).run(likelihood.log_prob, initial, steps=150)
    return likelihood.unpack(result.particles)[:, 0]


def test_references_differ(references):
    _, states = references
    assert float((states[0, :, :2] - states[1, :, :2]).abs().max()) > 0.1


def test_sum_keeps_both_link_lengths(references):
    lengths = _fit(references, 'sum')
    for true in LENGTHS:
        near = (lengths - true).abs() < 0.006
        assert float(near.float().mean()) > 0.25, (true, lengths)
    between = (lengths > LENGTHS[0] + 0.01) & (lengths < LENGTHS[1] - 0.01)
    assert float(between.float().mean()) < 0.2


def test_product_collapses_between_them(references):
    lengths = _fit(references, 'product')
    assert float(lengths.min()) > LENGTHS[0] + 0.006, lengths
    assert float(lengths.max()) < LENGTHS[1] - 0.006, lengths
    assert float(lengths.std()) < 0.01
