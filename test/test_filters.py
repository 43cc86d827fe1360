"""
Tests of the data pipeline in ``diffsim_ros.sysid``: derivative filters and preprocessing.

Filters are checked on analytic signals (sines, chirps) with added noise, against their
exact derivatives: error bounds away from the edges, zero phase lag of the offline filters,
and the documented lag of the causal differentiator.  Preprocessing is checked on signals
whose interpolation is exact (linear ramps, constant-rate rotations).
"""

import math

from diffsim_ros.sysid.dataset import Trajectory
from diffsim_ros.sysid.filters import (accelerations_from_velocity, CausalDifferentiator,
                                       estimate_derivatives, lowpass_filtfilt, savgol_derivative,
                                       savgol_window)
from diffsim_ros.sysid.preprocess import (align_streams, matrix_to_quaternion,
                                          quaternion_to_matrix, resample, segment,
                                          segment_tensors, slerp_poses, split_blocks,
                                          split_runs, split_time, unwrap_angles)
import numpy as np
import pytest
from scipy import signal
import torch

RATE = 500.0
NOISE = 1e-4          # rad, about the quantisation of a 2^16 count encoder


def _chirp(t: np.ndarray, f0: float = 0.5, f1: float = 4.0, duration: float = 8.0):
    """Return q, qd, qdd of a linear chirp ``sin(2 pi (f0 t + k t^2 / 2))``."""
    k = (f1 - f0) / duration
    phase = 2 * math.pi * (f0 * t + 0.5 * k * t ** 2)
    rate = 2 * math.pi * (f0 + k * t)
    return (np.sin(phase), rate * np.cos(phase),
            2 * math.pi * k * np.cos(phase) - rate ** 2 * np.sin(phase))


def _trajectory(t: np.ndarray, q: np.ndarray, **fields) -> Trajectory:
    q = q.reshape(len(t), -1)
    names = tuple(f'j{i}' for i in range(q.shape[1]))
    tensors = {k: torch.as_tensor(v.reshape(len(t), -1)) for k, v in fields.items()}
    return Trajectory(t=torch.as_tensor(t), q=torch.as_tensor(q), joint_names=names, **tensors)


def _interior(x: np.ndarray, fraction: float = 0.08) -> np.ndarray:
    cut = int(fraction * len(x))
    return x[cut:len(x) - cut]


def _rel_rms(estimate, truth) -> float:
    estimate = np.asarray(estimate).reshape(-1)
    truth = np.asarray(truth).reshape(-1)
    return float(np.sqrt(np.mean(_interior(estimate - truth) ** 2)
                         / np.mean(_interior(truth) ** 2)))


@pytest.fixture(scope='module')
def noisy_chirp():
    rng = np.random.default_rng(1)
    t = np.arange(0.0, 8.0, 1.0 / RATE)
    q, qd, qdd = _chirp(t)
    return t, q + NOISE * rng.standard_normal(t.shape), qd, qdd


# --------------------------------------------------------------------------------------
# Offline filters
# --------------------------------------------------------------------------------------
def test_filtfilt_has_zero_phase_lag():
    rng = np.random.default_rng(0)
    t = np.arange(0.0, 10.0, 1.0 / RATE)
    clean = np.sin(2 * math.pi * 2.0 * t)
    noisy = clean + 0.05 * rng.standard_normal(t.shape)
    smooth = lowpass_filtfilt(torch.as_tensor(noisy), RATE, cutoff_hz=10.0).numpy()
    lags = np.arange(-20, 21)
    zero_phase = [np.dot(_interior(np.roll(smooth, -lag)), _interior(clean)) for lag in lags]
    assert lags[int(np.argmax(zero_phase))] == 0
    assert np.sqrt(np.mean(_interior(smooth - clean) ** 2)) < 0.015     # noise 0.05 rms
    # a one-way (causal) Butterworth of the same order does lag: contrast
    sos = signal.butter(4, 10.0, fs=RATE, output='sos')
    causal = signal.sosfilt(sos, noisy)
    one_way = [np.dot(_interior(np.roll(causal, -lag)), _interior(clean)) for lag in lags]
    assert lags[int(np.argmax(one_way))] >= 10


def test_filtfilt_accepts_timestamps_and_keeps_dtype():
    t = torch.arange(0.0, 2.0, 1.0 / RATE, dtype=torch.float64)
    x = torch.stack([torch.sin(3 * t), torch.cos(3 * t)], -1).to(torch.float32)
    by_rate = lowpass_filtfilt(x, RATE, 20.0)
    by_time = lowpass_filtfilt(x, t, 20.0)
    assert by_rate.dtype == torch.float32 and by_rate.shape == x.shape
    assert torch.allclose(by_rate, by_time)


# Measured relative RMS errors (chirp 0.5-4 Hz, 1e-4 rad noise, 500 Hz): filtfilt at 15 Hz
# 0.03 % (qd) / 0.07 % (qdd); Savitzky-Golay (quartic) at 30 Hz: 0.27 % / 0.21 %.
@pytest.mark.parametrize('method,cutoff,qd_bound,qdd_bound', [
    ('filtfilt', 15.0, 0.002, 0.005), ('savgol', 30.0, 0.005, 0.01)])
def test_offline_derivatives_of_a_noisy_chirp(noisy_chirp, method, cutoff, qd_bound,
                                              qdd_bound):
    t, q, qd, qdd = noisy_chirp
    out = estimate_derivatives(_trajectory(t, q), method, cutoff_hz=cutoff)
    assert torch.equal(out.t, torch.as_tensor(t))
    assert torch.equal(out.q[:, 0], torch.as_tensor(q))        # positions stay as measured
    assert _rel_rms(out.qd.numpy(), qd) < qd_bound
    assert _rel_rms(out.qdd.numpy(), qdd) < qdd_bound


@pytest.mark.parametrize('method,cutoff', [('filtfilt', 10.0), ('savgol', 20.0)])
def test_offline_derivatives_on_non_uniform_timestamps(method, cutoff):
    rng = np.random.default_rng(2)
    t = np.cumsum(rng.uniform(0.5e-3, 3.5e-3, 3000))        # 1 to 3.5 ms, mean 2 ms
    q, qd, qdd = _chirp(t, 0.3, 2.0, t[-1])
    out = estimate_derivatives(_trajectory(t, q + NOISE * rng.standard_normal(t.shape)),
                               method, cutoff_hz=cutoff)
    assert torch.equal(out.t, torch.as_tensor(t))
    assert _rel_rms(out.qd.numpy(), qd) < 0.01
    assert _rel_rms(out.qdd.numpy(), qdd) < 0.05


def test_torque_gets_the_same_low_pass_as_positions(noisy_chirp):
    t, q, _, _ = noisy_chirp
    traj = _trajectory(t, np.stack([q, 2 * q], 1), tau=np.stack([q, -q], 1))
    out = estimate_derivatives(traj, 'filtfilt', cutoff_hz=15.0)
    expected = lowpass_filtfilt(traj.tau, traj.t, 15.0)
    assert torch.allclose(out.tau, expected)
    kept = estimate_derivatives(traj, 'filtfilt', cutoff_hz=15.0, filter_torque=False)
    assert torch.equal(kept.tau, traj.tau)


@pytest.mark.parametrize('method', ['filtfilt', 'savgol', 'causal'])
def test_commands_get_the_same_filter_as_torques_when_asked(noisy_chirp, method):
    t, q, _, _ = noisy_chirp
    square = np.sign(np.sin(2 * math.pi * 3.0 * t))      # a bang-bang voltage
    traj = _trajectory(t, np.stack([q, 2 * q], 1), tau=np.stack([square, -square], 1),
                       u=square)
    out = estimate_derivatives(traj, method, cutoff_hz=15.0, filter_inputs=True)
    torch.testing.assert_close(out.u[:, 0], out.tau[:, 0])    # one filter for both
    assert not torch.equal(out.u, traj.u)
    kept = estimate_derivatives(traj, method, cutoff_hz=15.0)
    assert torch.equal(kept.u, traj.u)
    # the commands alone, without torques
    alone = estimate_derivatives(traj.replace(tau=None), method, cutoff_hz=15.0,
                                 filter_inputs=True)
    torch.testing.assert_close(alone.u, out.u)
    assert alone.tau is None


def test_accelerations_from_measured_velocity(noisy_chirp):
    t, q, qd, qdd = noisy_chirp
    rng = np.random.default_rng(2)
    measured = qd + 1e-3 * rng.standard_normal(t.shape)
    square = np.sign(np.sin(2 * math.pi * 3.0 * t))
    traj = _trajectory(t, q, qd=measured, tau=square, u=square)
    out = accelerations_from_velocity(traj, cutoff_hz=15.0, filter_inputs=True)
    assert torch.equal(out.q, traj.q)                          # positions as measured
    assert _rel_rms(out.qd.numpy(), qd) < 0.005
    # one differentiation of qd: more accurate than two of q at the same cutoff
    from_q = estimate_derivatives(traj, 'filtfilt', cutoff_hz=15.0)
    assert _rel_rms(out.qdd.numpy(), qdd) < 0.02
    assert _rel_rms(out.qdd.numpy(), qdd) < _rel_rms(from_q.qdd.numpy(), qdd)
    expected = lowpass_filtfilt(traj.u, traj.t, 15.0)
    torch.testing.assert_close(out.u, expected)
    torch.testing.assert_close(out.tau, expected)
    kept = accelerations_from_velocity(traj, cutoff_hz=15.0, filter_torque=False)
    assert torch.equal(kept.u, traj.u) and torch.equal(kept.tau, traj.tau)
    with pytest.raises(ValueError, match='qd'):
        accelerations_from_velocity(traj.replace(qd=None))
    with pytest.raises(ValueError):
        accelerations_from_velocity(traj, cutoff_hz=RATE)


def test_savgol_derivative_is_exact_on_cubics():
    t = np.linspace(0.0, 1.0, 201)
    x = 1.0 - 2.0 * t + 0.5 * t ** 2 + 3.0 * t ** 3
    d1 = savgol_derivative(x, t, deriv=1, window=21, polyorder=3).numpy()
    d2 = savgol_derivative(x, 200.0, deriv=2, window=21, polyorder=3).numpy()
    assert np.allclose(d1, -2.0 + t + 9.0 * t ** 2, atol=1e-9)
    assert np.allclose(d2, 1.0 + 18.0 * t, atol=1e-7)


def test_savgol_window_follows_the_cutoff():
    windows = [savgol_window(500.0, f) for f in (5.0, 10.0, 20.0, 50.0)]
    assert all(w % 2 == 1 for w in windows)
    assert windows == sorted(windows, reverse=True)
    assert savgol_window(500.0, 240.0, polyorder=3) >= 5


def test_filter_argument_errors():
    x = torch.zeros(100)
    with pytest.raises(ValueError, match='Nyquist'):
        lowpass_filtfilt(x, 100.0, 60.0)
    with pytest.raises(ValueError, match='valid: filtfilt, savgol, causal'):
        estimate_derivatives(_trajectory(np.arange(10.0), np.zeros(10)), 'spline')
    with pytest.raises(ValueError, match='strictly increasing'):
        lowpass_filtfilt(x, torch.zeros(100), 5.0)
    with pytest.raises(ValueError, match='window'):
        savgol_derivative(x, 100.0, deriv=1, window=10)
    with pytest.raises(ValueError, match='window or cutoff_hz'):
        savgol_derivative(x, 100.0)


# --------------------------------------------------------------------------------------
# Causal differentiator
# --------------------------------------------------------------------------------------
def test_causal_lag_matches_the_documented_value():
    cutoff, f = 20.0, 0.5
    diff = CausalDifferentiator(cutoff)
    assert diff.lag_s == pytest.approx(2.0 / (2 * math.pi * cutoff))   # 15.9 ms
    t = np.arange(0.0, 6.0, 1.0 / RATE)
    w = 2 * math.pi * f
    out = np.array([np.concatenate([x.numpy() for x in diff.update(tk, [math.sin(w * tk)])])
                    for tk in t])
    settled = t > 1.0
    delayed = t[settled] - diff.lag_s
    # all three outputs are the signal's value/derivatives lag_s earlier, to 1 % of amplitude
    assert np.abs(out[settled, 0] - np.sin(w * delayed)).max() < 0.01
    assert np.abs(out[settled, 1] - w * np.cos(w * delayed)).max() < 0.01 * w
    assert np.abs(out[settled, 2] + w * w * np.sin(w * delayed)).max() < 0.01 * w * w
    # lag measured by cross-correlation equals the documented lag within one sample
    lags = np.arange(0, 20)
    score = [np.dot(out[settled, 0], np.sin(w * (t[settled] - lag / RATE))) for lag in lags]
    assert abs(lags[int(np.argmax(score))] / RATE - diff.lag_s) <= 1.0 / RATE


def test_causal_differentiator_is_exact_for_ramps_and_constants_on_jittered_time():
    rng = np.random.default_rng(3)
    t = np.cumsum(rng.uniform(0.5e-3, 4e-3, 2000))
    diff = CausalDifferentiator(10.0)
    for tk in t:
        q_f, qd, qdd = diff.update(tk, [2.0 - 0.7 * tk, 1.5])
    assert qd.tolist() == pytest.approx([-0.7, 0.0], abs=1e-9)
    assert qdd.tolist() == pytest.approx([0.0, 0.0], abs=1e-7)
    assert q_f[0].item() == pytest.approx(2.0 - 0.7 * (t[-1] - diff.lag_s), abs=1e-9)
    assert q_f.dtype == torch.float64 and q_f.shape == (2,)


def test_causal_noise_and_chirp_error_bounds(noisy_chirp):
    t, q, qd, qdd = noisy_chirp
    out = estimate_derivatives(_trajectory(t, q), 'causal', cutoff_hz=30.0)
    lag = CausalDifferentiator(30.0).lag_s
    _, qd_late, qdd_late = _chirp(t - lag)
    # against the delayed truth the causal estimates are as good as the offline ones
    assert _rel_rms(out.qd.numpy(), qd_late) < 0.01
    assert _rel_rms(out.qdd.numpy(), qdd_late) < 0.05
    # against the undelayed truth the error is the lag: about w * lag at the chirp's top end
    assert _rel_rms(out.qd.numpy(), qd) > 0.05


def test_causal_per_sample_equals_batch_and_skips_stale_samples():
    t = np.arange(0.0, 1.0, 1.0 / RATE)
    q = np.sin(5 * t)
    batch = estimate_derivatives(_trajectory(t, q), 'causal', cutoff_hz=20.0)
    diff = CausalDifferentiator(20.0)
    for k, tk in enumerate(t):
        _, qd, _ = diff.update(tk, [q[k]])
        if k == 100:
            before = qd.clone()
            _, again, _ = diff.update(tk, [q[k] + 1.0])       # duplicate stamp: ignored
            _, older, _ = diff.update(tk - 0.01, [0.0])       # out of order: ignored
            assert torch.equal(again, before) and torch.equal(older, before)
    assert diff.skipped == 2
    assert qd.item() == pytest.approx(batch.qd[-1, 0].item(), rel=1e-12)
    diff.reset()
    assert diff.update(0.0, [1.0])[1].item() == 0.0
    with pytest.raises(ValueError):
        CausalDifferentiator(0.0)


# --------------------------------------------------------------------------------------
# Preprocessing
# --------------------------------------------------------------------------------------
def test_unwrap_angles_removes_jumps():
    t = np.linspace(0.0, 4.0, 400)
    angle = 3.0 * t                                       # 12 rad: wraps twice
    wrapped = (angle + math.pi) % (2 * math.pi) - math.pi
    traj = _trajectory(t, np.stack([wrapped, wrapped], 1))
    out = unwrap_angles(traj, ['j1'])
    assert np.allclose(out.q[:, 1].numpy(), angle - angle[0] + wrapped[0])
    assert torch.equal(out.q[:, 0], traj.q[:, 0])
    with pytest.raises(KeyError, match='nope'):
        unwrap_angles(traj, ['nope'])


def _rotation_z(angle: np.ndarray) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    R = np.zeros(angle.shape + (3, 3))
    R[..., 0, 0], R[..., 0, 1], R[..., 1, 0], R[..., 1, 1] = c, -s, s, c
    R[..., 2, 2] = 1.0
    return R


def _poses(t: np.ndarray, omega: float) -> np.ndarray:
    T = np.zeros((len(t), 4, 4))
    T[:, :3, :3] = _rotation_z(omega * t)
    T[:, :3, 3] = np.stack([t, -2 * t, 0.5 + 0 * t], 1)
    T[:, 3, 3] = 1.0
    return T


def test_resample_interpolates_states_holds_commands_and_slerps_poses():
    rng = np.random.default_rng(4)
    t = np.cumsum(rng.uniform(1e-3, 5e-3, 400))
    q = np.stack([1.0 + 2.0 * t, -t], 1)
    u = np.floor(t * 10)[:, None]                         # piecewise constant
    traj = Trajectory(t=torch.as_tensor(t), q=torch.as_tensor(q), joint_names=('a', 'b'),
                      tau=torch.as_tensor(3 * q), u=torch.as_tensor(u),
                      poses={'box': torch.as_tensor(_poses(t, 2.0))})
    out = resample(traj, 250.0)
    grid = out.t.numpy()
    assert np.allclose(np.diff(grid), 1 / 250.0) and grid[0] == t[0] and grid[-1] <= t[-1]
    assert np.allclose(out.q.numpy(), np.stack([1.0 + 2.0 * grid, -grid], 1))
    assert np.allclose(out.tau.numpy(), 3 * out.q.numpy())
    held = u[np.searchsorted(t, grid, side='right') - 1]
    assert np.array_equal(out.u.numpy(), held)
    assert np.allclose(out.poses['box'].numpy(), _poses(grid, 2.0), atol=1e-9)
    with pytest.raises(ValueError):
        resample(traj, 0.0)


def test_quaternions_round_trip_including_half_turns():
    rng = np.random.default_rng(5)
    A = rng.standard_normal((200, 3, 3))
    Q, _ = np.linalg.qr(A)
    Q *= np.sign(np.linalg.det(Q))[:, None, None]
    half_turns = np.array([np.diag([1.0, -1.0, -1.0]), np.diag([-1.0, 1.0, -1.0]),
                           np.diag([-1.0, -1.0, 1.0])])
    R = np.concatenate([Q, half_turns, np.eye(3)[None]])
    quat = matrix_to_quaternion(R)
    assert np.allclose(np.linalg.norm(quat, axis=-1), 1.0) and (quat[:, 0] >= 0).all()
    assert np.allclose(quaternion_to_matrix(quat), R, atol=1e-12)


def test_slerp_takes_the_short_way_across_the_quaternion_sign_flip():
    t = np.array([0.0, 1.0])
    angles = np.array([math.pi - 0.1, math.pi + 0.1])     # 0.2 rad apart through pi
    T = np.tile(np.eye(4), (2, 1, 1))
    T[:, :3, :3] = _rotation_z(angles)
    mid = slerp_poses(np.array([0.5]), t, T)[0]
    assert np.allclose(mid[:3, :3], _rotation_z(np.array(math.pi)), atol=1e-12)


def test_align_streams_crops_holds_commands_and_interpolates_poses():
    rng = np.random.default_rng(6)
    t_joint = np.cumsum(rng.uniform(1.5e-3, 2.5e-3, 1000))      # about 500 Hz, 2 s
    joint = _trajectory(t_joint, np.stack([np.sin(t_joint), t_joint], 1))
    t_cmd = 0.3 + np.arange(0, 150) / 100.0                      # 100 Hz from 0.3 s
    u = rng.standard_normal((150, 2))
    t_pose = 0.1 + np.arange(0, 200) / 120.0                     # 120 Hz until 1.76 s
    out = align_streams(joint, (torch.as_tensor(t_cmd), torch.as_tensor(u)),
                        {'tool': (torch.as_tensor(t_pose), torch.as_tensor(_poses(t_pose, 1.0)))})
    t = out.t.numpy()
    assert t[0] >= 0.3 and t[-1] <= min(t_cmd[-1], t_pose[-1], t_joint[-1])
    assert set(t) <= set(t_joint)                                 # joint stamps are kept
    assert len(t) == np.count_nonzero((t_joint >= 0.3) & (t_joint <= t_pose[-1]))
    assert np.allclose(out.q[:, 1].numpy(), t)
    assert np.array_equal(out.u.numpy(), u[np.searchsorted(t_cmd, t, side='right') - 1])
    assert np.allclose(out.poses['tool'].numpy(), _poses(t, 1.0), atol=1e-9)
    uniform = align_streams(joint, (torch.as_tensor(t_cmd), torch.as_tensor(u)), rate_hz=200.0)
    assert np.allclose(np.diff(uniform.t.numpy()), 1 / 200.0)
    with pytest.raises(ValueError, match='do not overlap'):
        align_streams(joint, (torch.as_tensor(t_cmd + 10.0), torch.as_tensor(u)))
    with pytest.raises(ValueError, match='expected shape'):
        align_streams(joint, (torch.as_tensor(t_cmd), torch.as_tensor(u[:10])))


def _runs(names):
    t = np.arange(20.0)
    return [_trajectory(t, np.full(20, float(i))).replace(run=name)
            for i, name in enumerate(names)]


def test_split_runs_never_splits_a_run():
    runs = _runs(['a', 'b', 'c', 'd', 'e'])
    pieces = [piece for traj in runs for piece in segment(traj, 5, 5)]   # 4 per run
    split = split_runs(pieces, validation=0.2, test=0.2)
    names = [{tr.run for tr in part} for part in split]
    assert names == [{'a', 'b', 'c'}, {'d'}, {'e'}]
    assert sum(len(part) for part in split) == len(pieces)
    assert len(split.validation) == 4 and len(split.test) == 4
    named = split_runs(runs, validation=['a'], test=['b', 'c'])
    assert [tr.run for tr in named.train] == ['d', 'e']
    first = split_runs(pieces, 0.4, generator=torch.Generator().manual_seed(0))
    again = split_runs(pieces, 0.4, generator=torch.Generator().manual_seed(0))
    assert [tr.run for tr in first.validation] == [tr.run for tr in again.validation]
    assert not {tr.run for tr in first.train} & {tr.run for tr in first.validation}


def test_split_runs_errors():
    runs = _runs(['a', 'b'])
    with pytest.raises(ValueError, match='no run left for training'):
        split_runs(runs[:1], validation=0.5)
    with pytest.raises(ValueError, match='unknown'):
        split_runs(runs, validation=['zzz'])
    with pytest.raises(TypeError, match='sequence of run names'):
        split_runs(runs, validation='a')
    with pytest.raises(ValueError, match='fraction'):
        split_runs(runs, validation=1.5)


def test_split_time_makes_contiguous_blocks():
    traj = _runs(['panda'])[0]
    split = split_time(traj, validation=0.25, test=0.25)
    (train,), (validation,), (test,) = split
    assert [tr.run for tr in (train, validation, test)] == [
        'panda#train', 'panda#validation', 'panda#test']
    assert len(train) + len(validation) + len(test) == len(traj)
    assert train.t[-1] < validation.t[0] and validation.t[-1] < test.t[0]
    assert split_time(traj, 0.2).test == []


def test_split_blocks_spreads_the_validation_blocks():
    t = np.arange(0.0, 10.0, 0.01)                     # 10 s at 100 Hz
    traj = _trajectory(t, np.sin(t), u=np.cos(t)).replace(run='run')
    split = split_blocks(traj, validation=0.2, block=1.0)
    assert [run.run for run in split.validation] == ['run#validation2', 'run#validation7']
    kept = (0, 1, 3, 4, 5, 6, 8, 9)
    assert [run.run for run in split.train] == [f'run#train{i}' for i in kept]
    assert split.test == []
    for run in split.train[:-1] + split.validation:    # whole blocks span exactly 1 s
        assert float(run.t[-1] - run.t[0]) == pytest.approx(1.0)
    # every sample is in exactly one block but for the shared boundary samples
    assert sum(len(run) for run in split.train + split.validation) == len(t) + 9
    quarter = split_blocks(traj, validation=0.4, block=2.0)
    assert [run.run for run in quarter.validation] == ['run#validation1', 'run#validation3']
    assert split_blocks(traj, validation=0.0).validation == []
    for bad in ({'validation': 1.0}, {'validation': -0.1}, {'block': 0.0}):
        with pytest.raises(ValueError, match='split_blocks'):
            split_blocks(traj, **bad)


def test_segment_and_segment_tensors_agree():
    t = np.arange(50) * 0.01
    traj = _trajectory(t, np.stack([t, -t], 1), tau=np.stack([2 * t, t], 1),
                       u=t[:, None]).replace(run='r', poses={'b': torch.as_tensor(_poses(t, 1.0))})
    pieces = segment(traj, window=10, stride=7)
    batch = segment_tensors(traj, window=10, stride=7)
    assert len(pieces) == batch['q'].shape[0] == (50 - 10) // 7 + 1
    assert all(piece.run == 'r' and len(piece) == 10 for piece in pieces)
    for k, piece in enumerate(pieces):
        assert torch.equal(batch['t'][k], piece.t)
        assert torch.equal(batch['q'][k], piece.q)
        assert torch.equal(batch['tau'][k], piece.tau)
        assert torch.equal(batch['u'][k], piece.u)
        assert torch.equal(batch['poses']['b'][k], piece.poses['b'])
    with pytest.raises(ValueError, match='longer'):
        segment(traj, 60, 1)
