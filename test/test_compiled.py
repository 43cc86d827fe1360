"""The torch.compile path used by the MPC hot loop gives the eager results."""

from diffsim_ros import robots
from diffsim_ros.core import aba, compile_algorithm, load_urdf
import pytest
import torch


def test_unknown_algorithm_lists_valid_names():
    with pytest.raises(ValueError, match='aba, rnea, crba'):
        compile_algorithm('lqr')


@pytest.mark.slow
def test_compiled_aba_matches_eager_and_reuses_code_for_refitted_models():
    model = load_urdf(xml=robots.urdf_string('qube'))
    fast_aba = compile_algorithm('aba')
    g = torch.Generator().manual_seed(0)
    q, qd, tau = (torch.randn(2, generator=g, dtype=torch.float64) for _ in range(3))
    with torch.no_grad():
        assert torch.allclose(fast_aba(model, q, qd, tau), aba(model, q, qd, tau),
                              rtol=1e-10, atol=1e-12)
        refit = model.replace(inertial=model.inertial * 1.2)
        torch._dynamo.utils.counters.clear()
        assert torch.allclose(fast_aba(refit, q, qd, tau), aba(refit, q, qd, tau),
                              rtol=1e-10, atol=1e-12)
        assert not torch._dynamo.utils.counters['stats'].get('unique_graphs', 0), \
            'a refitted model with the same shapes must not recompile'
