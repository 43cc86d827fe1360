// Per-sample C++ kernels of the contact cone problem for diffsim_ros.core.native_contact.
//
// The same algorithm as diffsim_ros/core/contact_solver.py, step for step, one sample at a
// time in a small workspace: accelerated projected gradient with adaptive restart (APGD,
// convergence checked every ten iterations), then semismooth Newton polish on the samples
// it left open; and the implicit backward, one LU solve with the transposed Jacobian of the
// fixed-point map at the solution.  The torch code runs each iteration as a dozen batched
// tensor operations over the whole batch (and the polish over the open samples together);
// here a sample's iterations run back to back in cache, and a sample stops when it converges.
//
// Components are [normal, tangent 1, tangent 2] per contact, m = 3 nc rows per sample.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>
#include <initializer_list>
#include <tuple>
#include <vector>

namespace {

constexpr int64_t kNewtonIterations = 10;  // contact_solver._NEWTON_ITERATIONS
// A call splits over threads only where each thread gets at least this many samples x m^2
// (one APGD iteration of one sample costs m^2 multiply-adds; a sample takes tens to
// hundreds of iterations, so this is a few hundred microseconds of work per thread).
constexpr int64_t kMinWorkPerThread = 64 * 24 * 24;
constexpr int64_t kChunksPerThread = 8;

// Threads and chunks of one call, and the chunked loop: the same rule as native/rnea.cpp's
// split_for/for_chunks (helper threads started per call, chunks taken from a shared counter,
// so a thread the scheduler takes away on a busy machine delays the call by one chunk and
// nothing spins between calls).
struct Split {
  int64_t chunks;
  int64_t threads;
};

Split split_for(int64_t batch, int64_t work) {
  if (at::in_parallel_region()) return {1, 1};
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), work / kMinWorkPerThread);
  if (threads <= 1) return {1, 1};
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(threads * kChunksPerThread,
                                                                batch));
  return {chunks, std::min<int64_t>(threads, chunks)};
}

template <typename F>
void for_samples(int64_t batch, int64_t m, const F& body) {
  const Split split = split_for(batch, batch * m * m);
  if (split.threads <= 1) {
    for (int64_t i = 0; i < batch; ++i) body(i);
    return;
  }
  const int64_t chunks = split.chunks;
  std::atomic<int64_t> next{0};
  const auto work = [&]() {
    for (int64_t c = next++; c < chunks; c = next++) {
      for (int64_t i = batch * c / chunks; i < batch * (c + 1) / chunks; ++i) body(i);
    }
  };
  std::vector<std::thread> helpers;
  helpers.reserve(split.threads - 1);
  for (int64_t t = 1; t < split.threads; ++t) helpers.emplace_back(work);
  work();
  for (auto& helper : helpers) helper.join();
}

// 1 / min(largest absolute row sum, Frobenius norm) of A (m x m): contact_solver._step_size.
template <typename T>
T step_size(const T* A, int64_t m) {
  T rows = 0, frob = 0;
  for (int64_t i = 0; i < m; ++i) {
    T row = 0;
    for (int64_t j = 0; j < m; ++j) {
      row += std::abs(A[i * m + j]);
      frob += A[i * m + j] * A[i * m + j];
    }
    rows = std::max(rows, row);
  }
  return T(1) / std::min(rows, std::sqrt(frob));
}

// Projection of one point y (3) onto {||t|| <= mu n}: contact_solver.project_friction_cone.
// Returns 0 inside, 1 on the polar cone (projection 0), 2 on the boundary.
template <typename T>
int project(const T* y, T mu, T* out) {
  const T n = y[0], t1 = y[1], t2 = y[2];
  const T s2 = t1 * t1 + t2 * t2;
  const T s = s2 > 0 ? std::sqrt(s2) : T(0);
  if (s <= mu * n) {
    out[0] = n, out[1] = t1, out[2] = t2;
    return 0;
  }
  if (mu * s <= -n) {
    out[0] = out[1] = out[2] = 0;
    return 1;
  }
  const T s_safe = s2 > 0 ? s : T(1);
  const T n_proj = (n + mu * s) / (T(1) + mu * mu);
  const T f = mu * n_proj / s_safe;
  out[0] = n_proj, out[1] = f * t1, out[2] = f * t2;
  return 2;
}

// Jacobians of the projection at y: d/dy (3 x 3, row-major) and d/dmu (3).
template <typename T>
void project_jacobian(const T* y, T mu, T* D, T* D_mu) {
  T out[3];
  const int where = project(y, mu, out);
  std::fill(D, D + 9, T(0));
  std::fill(D_mu, D_mu + 3, T(0));
  if (where == 0) {
    D[0] = D[4] = D[8] = 1;
    return;
  }
  if (where == 1) return;
  const T n = y[0];
  const T s = std::sqrt(y[1] * y[1] + y[2] * y[2]);
  const T u[2] = {y[1] / s, y[2] / s};
  const T c = T(1) / (T(1) + mu * mu);
  const T n_proj = (n + mu * s) * c;
  const T dnp_dmu = (s - T(2) * mu * n_proj) * c;
  D[0] = c;
  D[1] = mu * c * u[0];
  D[2] = mu * c * u[1];
  const T radial = mu * mu * c, tangential = mu * n_proj / s;
  for (int a = 0; a < 2; ++a) {
    D[(a + 1) * 3] = mu * c * u[a];
    for (int b = 0; b < 2; ++b) {
      const T uu = u[a] * u[b];
      D[(a + 1) * 3 + b + 1] = tangential * ((a == b ? T(1) : T(0)) - uu) + radial * uu;
    }
  }
  D_mu[0] = dnp_dmu;
  D_mu[1] = (n_proj + mu * dnp_dmu) * u[0];
  D_mu[2] = (n_proj + mu * dnp_dmu) * u[1];
}

// out = A x + b
template <typename T>
void affine(const T* A, const T* x, const T* b, int64_t m, T* out) {
  for (int64_t i = 0; i < m; ++i) {
    T acc = 0;
    const T* row = A + i * m;
    for (int64_t j = 0; j < m; ++j) acc += row[j] * x[j];
    out[i] = acc + b[i];
  }
}

// out = P_K(x - alpha (A x + b)), work (m) scratch.
template <typename T>
void prox(const T* A, const T* b, const T* mu, T alpha, const T* x, int64_t m, T* work,
          T* out) {
  affine(A, x, b, m, work);
  for (int64_t i = 0; i < m; ++i) work[i] = x[i] - alpha * work[i];
  for (int64_t c = 0; c < m / 3; ++c) project(work + 3 * c, mu[c], out + 3 * c);
}

// F = x - P_K(x - alpha (A x + b)); returns max |F| / alpha (the natural residual).
template <typename T>
T fixed_point(const T* A, const T* b, const T* mu, T alpha, const T* x, int64_t m, T* work,
              T* F) {
  prox(A, b, mu, alpha, x, m, work, F);
  T worst = 0;
  for (int64_t i = 0; i < m; ++i) {
    F[i] = x[i] - F[i];
    worst = std::max(worst, std::abs(F[i]));
  }
  return worst / alpha;
}

// LU factorisation with partial pivoting of M (m x m, in place); false when singular.
template <typename T>
bool lu_factor(T* M, int64_t m, int64_t* pivot) {
  for (int64_t k = 0; k < m; ++k) {
    int64_t p = k;
    T best = std::abs(M[k * m + k]);
    for (int64_t i = k + 1; i < m; ++i) {
      if (std::abs(M[i * m + k]) > best) best = std::abs(M[i * m + k]), p = i;
    }
    pivot[k] = p;
    if (!(best > 0)) return false;
    if (p != k) {
      for (int64_t j = 0; j < m; ++j) std::swap(M[k * m + j], M[p * m + j]);
    }
    const T inv = T(1) / M[k * m + k];
    for (int64_t i = k + 1; i < m; ++i) {
      const T f = (M[i * m + k] *= inv);
      if (f == 0) continue;
      for (int64_t j = k + 1; j < m; ++j) M[i * m + j] -= f * M[k * m + j];
    }
  }
  return true;
}

// Solves LU x = r in place (r -> x) with the factors and pivots of lu_factor.
template <typename T>
void lu_solve(const T* LU, const int64_t* pivot, int64_t m, T* r) {
  for (int64_t k = 0; k < m; ++k) std::swap(r[k], r[pivot[k]]);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < i; ++j) r[i] -= LU[i * m + j] * r[j];
  }
  for (int64_t i = m - 1; i >= 0; --i) {
    for (int64_t j = i + 1; j < m; ++j) r[i] -= LU[i * m + j] * r[j];
    r[i] /= LU[i * m + i];
  }
}

// K = I - D + alpha D A at x (D the block-diagonal projection Jacobian at x - alpha (A x + b)),
// with D (m x 3 per row: the block of each row) and D_mu (m) kept for the backward.
template <typename T>
void fixed_point_jacobian(const T* A, const T* b, const T* mu, T alpha, const T* x, int64_t m,
                          T* work, T* D, T* D_mu, T* K) {
  affine(A, x, b, m, work);
  for (int64_t i = 0; i < m; ++i) work[i] = x[i] - alpha * work[i];
  for (int64_t c = 0; c < m / 3; ++c) project_jacobian(work + 3 * c, mu[c], D + 9 * c,
                                                       D_mu + 3 * c);
  for (int64_t i = 0; i < m; ++i) {
    const int64_t c = i / 3, r = i % 3;
    const T* Drow = D + 9 * c + 3 * r;
    for (int64_t j = 0; j < m; ++j) {
      T acc = 0;
      for (int64_t k = 0; k < 3; ++k) acc += Drow[k] * A[(3 * c + k) * m + j];
      T value = alpha * acc;
      if (j / 3 == c) value -= Drow[j % 3];
      if (j == i) value += 1;
      K[i * m + j] = value;
    }
  }
}

// One sample's APGD (contact_solver._apgd) then, where still open, Newton
// (contact_solver._newton); returns the number of APGD iterations run.
template <typename T>
int64_t solve_sample(const T* A, const T* b, const T* mu, int64_t m, T tol, int64_t max_iter,
                     T* out) {
  std::vector<T> buffer(8 * m + m * m + 4 * m);
  std::vector<int64_t> pivot(m);
  T* lam = buffer.data();
  T* lam_next = lam + m;
  T* y = lam_next + m;
  T* work = y + m;
  T* zero = work + m;
  T* F = zero + m;
  T* cand = F + m;
  T* F_new = cand + m;
  T* K = F_new + m;
  T* D = K + m * m;
  T* D_mu = D + 3 * m;
  const T alpha = step_size(A, m);
  T scale = 0;
  for (int64_t i = 0; i < m; ++i) scale = std::max(scale, std::abs(b[i]));
  scale += 1;
  const T bound = tol * scale;
  std::fill(zero, zero + m, T(0));
  prox(A, b, mu, alpha, zero, m, work, lam);
  std::copy(lam, lam + m, y);
  T theta = 1;
  int64_t iteration = 0;
  for (iteration = 1; iteration <= max_iter; ++iteration) {
    prox(A, b, mu, alpha, y, m, work, lam_next);
    if (iteration % 10 == 0) {
      T step = 0;
      for (int64_t i = 0; i < m; ++i) step = std::max(step, std::abs(lam_next[i] - y[i]));
      if (step / alpha <= bound) {
        std::copy(lam_next, lam_next + m, lam);
        break;
      }
    }
    const T theta_next = T(0.5) * (-theta * theta + theta * std::sqrt(theta * theta + T(4)));
    const T beta = theta * (T(1) - theta) / (theta * theta + theta_next);
    T uphill = 0;
    for (int64_t i = 0; i < m; ++i) uphill += (y[i] - lam_next[i]) * (lam_next[i] - lam[i]);
    if (uphill > 0) {
      std::copy(lam_next, lam_next + m, y);
      theta = 1;
    } else {
      for (int64_t i = 0; i < m; ++i) y[i] = lam_next[i] + beta * (lam_next[i] - lam[i]);
      theta = theta_next;
    }
    std::copy(lam_next, lam_next + m, lam);
  }
  // Newton polish where the natural residual is above the tolerance.
  T residual = fixed_point(A, b, mu, alpha, lam, m, work, F);
  for (int64_t k = 0; k < kNewtonIterations && residual > bound; ++k) {
    fixed_point_jacobian(A, b, mu, alpha, lam, m, work, D, D_mu, K);
    bool better = lu_factor(K, m, pivot.data());
    if (better) {
      for (int64_t i = 0; i < m; ++i) cand[i] = -F[i];
      lu_solve(K, pivot.data(), m, cand);
      for (int64_t i = 0; i < m; ++i) cand[i] += lam[i];
      const T residual_new = fixed_point(A, b, mu, alpha, cand, m, work, F_new);
      bool finite = true;
      for (int64_t i = 0; i < m; ++i) finite = finite && std::isfinite(F_new[i]);
      better = finite && residual_new < residual;
    }
    if (better) {
      std::copy(cand, cand + m, lam);
    } else {
      for (int64_t i = 0; i < m; ++i) lam[i] -= F[i];
    }
    residual = fixed_point(A, b, mu, alpha, lam, m, work, F);
  }
  std::copy(lam, lam + m, out);
  return std::min(iteration, max_iter);
}

void check_problem(const torch::Tensor& A, const torch::Tensor& b, const torch::Tensor& mu) {
  TORCH_CHECK(A.dim() == 3 && b.dim() == 2 && mu.dim() == 2, "A (N, m, m), b (N, m), mu (N, nc)");
  const int64_t N = b.size(0), m = b.size(1);
  TORCH_CHECK(m % 3 == 0 && A.size(0) == N && A.size(1) == m && A.size(2) == m &&
                  mu.size(0) == N && mu.size(1) == m / 3,
              "cone problem shapes do not match: A ", A.sizes(), ", b ", b.sizes(), ", mu ",
              mu.sizes());
  TORCH_CHECK(A.is_contiguous() && b.is_contiguous() && mu.is_contiguous(),
              "cone problem tensors must be contiguous");
  TORCH_CHECK(A.scalar_type() == b.scalar_type() && A.scalar_type() == mu.scalar_type(),
              "cone problem tensors must share one dtype");
}

// lam (N, m) of N problems min 0.5 l^T A l + b^T l over the friction cones.
torch::Tensor cone_solve(const torch::Tensor& A, const torch::Tensor& b, const torch::Tensor& mu,
                         double tol, int64_t max_iter) {
  check_problem(A, b, mu);
  const int64_t N = b.size(0), m = b.size(1);
  auto lam = torch::empty_like(b);
  AT_DISPATCH_FLOATING_TYPES(b.scalar_type(), "cone_solve", [&] {
    const scalar_t* pA = A.data_ptr<scalar_t>();
    const scalar_t* pb = b.data_ptr<scalar_t>();
    const scalar_t* pmu = mu.data_ptr<scalar_t>();
    scalar_t* pl = lam.data_ptr<scalar_t>();
    for_samples(N, m, [&](int64_t i) {
      solve_sample<scalar_t>(pA + i * m * m, pb + i * m, pmu + i * (m / 3), m,
                             static_cast<scalar_t>(tol), max_iter, pl + i * m);
    });
  });
  return lam;
}

// Implicit backward at the solutions lam: K^T w = g, grad_b = -alpha D^T w,
// grad_A = grad_b lam^T, grad_mu_c = sum_k D_mu[c, k] w[3 c + k].
std::vector<torch::Tensor> cone_backward(const torch::Tensor& A, const torch::Tensor& b,
                                         const torch::Tensor& mu, const torch::Tensor& lam,
                                         const torch::Tensor& grad_lam) {
  check_problem(A, b, mu);
  TORCH_CHECK(lam.sizes() == b.sizes() && grad_lam.sizes() == b.sizes() &&
                  lam.is_contiguous() && grad_lam.is_contiguous(),
              "lam and grad_lam must be contiguous and shaped like b");
  const int64_t N = b.size(0), m = b.size(1);
  auto grad_A = torch::empty_like(A);
  auto grad_b = torch::empty_like(b);
  auto grad_mu = torch::empty_like(mu);
  AT_DISPATCH_FLOATING_TYPES(b.scalar_type(), "cone_backward", [&] {
    const scalar_t* pA = A.data_ptr<scalar_t>();
    const scalar_t* pb = b.data_ptr<scalar_t>();
    const scalar_t* pmu = mu.data_ptr<scalar_t>();
    const scalar_t* pl = lam.data_ptr<scalar_t>();
    const scalar_t* pg = grad_lam.data_ptr<scalar_t>();
    scalar_t* gA = grad_A.data_ptr<scalar_t>();
    scalar_t* gb = grad_b.data_ptr<scalar_t>();
    scalar_t* gmu = grad_mu.data_ptr<scalar_t>();
    for_samples(N, m, [&](int64_t s) {
      const scalar_t* As = pA + s * m * m;
      const scalar_t* ls = pl + s * m;
      std::vector<scalar_t> buffer(m * m + 6 * m);
      std::vector<int64_t> pivot(m);
      scalar_t* KT = buffer.data();
      scalar_t* D = KT + m * m;
      scalar_t* D_mu = D + 3 * m;
      scalar_t* work = D_mu + m;
      scalar_t* w = work + m;
      // K is built in KT, then transposed in place.
      const scalar_t alpha = step_size(As, m);
      fixed_point_jacobian(As, pb + s * m, pmu + s * (m / 3), alpha, ls, m, work, D, D_mu, KT);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = i + 1; j < m; ++j) std::swap(KT[i * m + j], KT[j * m + i]);
      }
      std::copy(pg + s * m, pg + (s + 1) * m, w);
      if (lu_factor(KT, m, pivot.data())) {
        lu_solve(KT, pivot.data(), m, w);
      } else {
        std::fill(w, w + m, std::numeric_limits<scalar_t>::quiet_NaN());
      }
      scalar_t* gbs = gb + s * m;
      for (int64_t c = 0; c < m / 3; ++c) {
        scalar_t acc = 0;
        for (int64_t k = 0; k < 3; ++k) {
          scalar_t col = 0;  // (D^T w)[3c + k] = sum_r D[c, r, k] w[3c + r]
          for (int64_t r = 0; r < 3; ++r) col += D[9 * c + 3 * r + k] * w[3 * c + r];
          gbs[3 * c + k] = -alpha * col;
          acc += D_mu[3 * c + k] * w[3 * c + k];
        }
        gmu[s * (m / 3) + c] = acc;
      }
      scalar_t* gAs = gA + s * m * m;
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < m; ++j) gAs[i * m + j] = gbs[i] * ls[j];
      }
    });
  });
  return {grad_A, grad_b, grad_mu};
}

// ---------------------------------------------------------------------------------------
// The whole step of free rigid bodies against the half-space ground (no gradients)
// ---------------------------------------------------------------------------------------

// A parameter given with one row shared by the batch (stride 0) or one row per sample.
template <typename T>
struct Param {
  const T* data;
  int64_t stride;
  const T* at(int64_t i) const { return data + i * stride; }
};

template <typename T>
Param<T> param(const torch::Tensor& x, int64_t batch, int64_t row, const char* name) {
  TORCH_CHECK(x.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(x.numel() == row || x.numel() == batch * row, name, " must hold ", row,
              " or ", batch, " x ", row, " values, got ", x.numel());
  return {x.data_ptr<T>(), x.numel() == row ? 0 : row};
}

template <typename T>
void cross(const T* a, const T* b, T* out) {
  out[0] = a[1] * b[2] - a[2] * b[1];
  out[1] = a[2] * b[0] - a[0] * b[2];
  out[2] = a[0] * b[1] - a[1] * b[0];
}

// quat_rotate of spatial.py: v + w t + u x t, t = 2 u x v (u, w the quaternion's parts).
template <typename T>
void quat_rotate(const T* quat, const T* v, T* out) {
  T t[3], ut[3];
  cross(quat, v, t);
  for (int k = 0; k < 3; ++k) t[k] *= 2;
  cross(quat, t, ut);
  for (int k = 0; k < 3; ++k) out[k] = v[k] + quat[3] * t[k] + ut[k];
}

// quat_exp of spatial.py (its series below theta^2 = 1e-4).
template <typename T>
void quat_exp(const T* w, T* out) {
  const T theta_sq = w[0] * w[0] + w[1] * w[1] + w[2] * w[2];
  T sinc, c;
  if (theta_sq < T(1e-4)) {
    sinc = T(0.5) - theta_sq / T(48) + theta_sq * theta_sq / T(3840);
    c = T(1) - theta_sq / T(8) + theta_sq * theta_sq / T(384);
  } else {
    const T theta = std::sqrt(theta_sq);
    sinc = std::sin(T(0.5) * theta) / theta;
    c = std::cos(T(0.5) * theta);
  }
  out[0] = sinc * w[0], out[1] = sinc * w[1], out[2] = sinc * w[2], out[3] = c;
}

// Cholesky factor (lower, in place) of a 6 x 6 SPD matrix; false when not positive definite.
template <typename T>
bool cholesky6(T* M) {
  for (int j = 0; j < 6; ++j) {
    T d = M[j * 6 + j];
    for (int k = 0; k < j; ++k) d -= M[j * 6 + k] * M[j * 6 + k];
    if (!(d > 0)) return false;
    d = std::sqrt(d);
    M[j * 6 + j] = d;
    for (int i = j + 1; i < 6; ++i) {
      T s = M[i * 6 + j];
      for (int k = 0; k < j; ++k) s -= M[i * 6 + k] * M[j * 6 + k];
      M[i * 6 + j] = s / d;
    }
  }
  return true;
}

template <typename T>
void cholesky6_solve(const T* L, T* x) {
  for (int i = 0; i < 6; ++i) {
    for (int k = 0; k < i; ++k) x[i] -= L[i * 6 + k] * x[k];
    x[i] /= L[i * 6 + i];
  }
  for (int i = 5; i >= 0; --i) {
    for (int k = i + 1; k < 6; ++k) x[i] -= L[k * 6 + i] * x[k];
    x[i] /= L[i * 6 + i];
  }
}


// One contact step of B free bodies (q (B, 7) = [p, quat x y z w], v (B, 6) = [linear,
// angular] in body axes) with K contact points (vertices: radius 0; sphere centres) in the
// body frame against the ground, the same arithmetic as contact.contact_step's torch code:
// contact_kinematics, free_velocity, then _complementarity (method 0) or _compliant (1),
// then configuration.semi_implicit_update.  Also returns a status: 0 for success, 1 when a
// configuration is not finite or its quaternion's norm is off 1 by more than quat_tolerance
// (configuration.check_configuration, which the caller then runs for its error), 2 when a
// mass matrix is not positive definite.
std::tuple<std::vector<torch::Tensor>, int64_t> free_body_step(
    const torch::Tensor& q, const torch::Tensor& v, const torch::Tensor& tau,
    const torch::Tensor& inertial, const torch::Tensor& armature, const torch::Tensor& gravity,
    const torch::Tensor& points, const torch::Tensor& radii, const torch::Tensor& friction,
    const torch::Tensor& restitution, const torch::Tensor& ground_height,
    const torch::Tensor& ground_tilt, const torch::Tensor& stiffness,
    const torch::Tensor& damping, const torch::Tensor& slip_velocity,
    std::vector<int64_t> batch_shape, double dt_, double tol_, int64_t max_iter,
    double regularization_, int64_t method, double quat_tolerance) {
  TORCH_CHECK(q.dim() >= 1 && q.size(-1) == 7 && q.is_contiguous(), "q must be (..., 7)");
  const int64_t B = q.numel() / 7;
  int64_t batch_size = 1;
  for (const int64_t n : batch_shape) batch_size *= n;
  TORCH_CHECK(batch_size == B, "batch_shape does not match q");
  const auto shape = [&](std::initializer_list<int64_t> trailing) {
    std::vector<int64_t> sizes(batch_shape);
    sizes.insert(sizes.end(), trailing);
    return sizes;
  };
  TORCH_CHECK(v.is_contiguous() && v.numel() == 6 * B, "v must be (B, 6)");
  TORCH_CHECK(tau.is_contiguous() && tau.numel() == 6 * B, "tau must be (B, 6)");
  TORCH_CHECK(radii.dim() >= 1, "radii must be (..., K)");
  const int64_t K = radii.size(-1), m = 3 * K;
  TORCH_CHECK(K > 0, "no contact points");
  auto opts = q.options();
  auto q_next = torch::empty(shape({7}), opts), v_next = torch::empty(shape({6}), opts);
  auto impulses = torch::empty(shape({K, 3}), opts), phi_out = torch::empty(shape({K}), opts);
  auto normal_out = torch::empty(shape({K, 3}), opts);
  auto tangents_out = torch::empty(shape({K, 2, 3}), opts);
  auto point_out = torch::empty(shape({K, 3}), opts);
  auto Jn_out = torch::empty(shape({K, 6}), opts), Jt_out = torch::empty(shape({K, 2, 6}), opts);
  std::atomic<int64_t> status{0};
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "free_body_step", [&] {
    using T = scalar_t;
    const T dt = static_cast<T>(dt_), tol = static_cast<T>(tol_);
    const T regularization = static_cast<T>(regularization_);
    const auto P_inertial = param<T>(inertial, B, 10, "inertial");
    const auto P_armature = param<T>(armature, B, 6, "armature");
    const auto P_gravity = param<T>(gravity, B, 3, "gravity");
    const auto P_points = param<T>(points, B, 3 * K, "points");
    const auto P_radii = param<T>(radii, B, K, "radii");
    const auto P_mu = param<T>(friction, B, 1, "friction");
    const auto P_e = param<T>(restitution, B, 1, "restitution");
    const auto P_h = param<T>(ground_height, B, 1, "ground_height");
    const auto P_tilt = param<T>(ground_tilt, B, 2, "ground_tilt");
    const auto P_k = param<T>(stiffness, B, 1, "stiffness");
    const auto P_c = param<T>(damping, B, 1, "damping");
    const auto P_vs = param<T>(slip_velocity, B, 1, "slip_velocity");
    const T* pq = q.data_ptr<T>();
    const T* pv = v.data_ptr<T>();
    const T* ptau = tau.data_ptr<T>();
    T* oq = q_next.data_ptr<T>();
    T* ov = v_next.data_ptr<T>();
    T* oimp = impulses.data_ptr<T>();
    T* ophi = phi_out.data_ptr<T>();
    T* on = normal_out.data_ptr<T>();
    T* ot = tangents_out.data_ptr<T>();
    T* opt = point_out.data_ptr<T>();
    T* oJn = Jn_out.data_ptr<T>();
    T* oJt = Jt_out.data_ptr<T>();
    for_samples(B, method == 0 ? m : 3, [&](int64_t s) {
      const T* qs = pq + 7 * s;
      const T* vs = pv + 6 * s;
      const T* quat = qs + 3;
      bool finite = true;
      for (int a = 0; a < 7; ++a) finite = finite && std::isfinite(qs[a]);
      const T norm = std::sqrt(quat[0] * quat[0] + quat[1] * quat[1] + quat[2] * quat[2] +
                               quat[3] * quat[3]);
      if (!finite || !(std::abs(norm - T(1)) <= static_cast<T>(quat_tolerance))) {
        status = 1;
        return;
      }
      // contact_kinematics: the body pose (quat_to_matrix), the ground frame, the points.
      T R[9];
      {
        const T x = quat[0], y = quat[1], z = quat[2], w = quat[3];
        const T sc = T(2) / (x * x + y * y + z * z + w * w);
        const T xx = sc * x * x, yy = sc * y * y, zz = sc * z * z;
        const T xy = sc * x * y, xz = sc * x * z, yz = sc * y * z;
        const T wx = sc * w * x, wy = sc * w * y, wz = sc * w * z;
        const T rows[9] = {T(1) - yy - zz, xy - wz, xz + wy, xy + wz, T(1) - xx - zz,
                           yz - wx, xz - wy, yz + wx, T(1) - xx - yy};
        std::copy(rows, rows + 9, R);
      }
      T G[9];  // ground_frame(tilt): columns tangent 1, tangent 2, normal
      {
        const T* tilt = P_tilt.at(s);
        const T ca = std::cos(tilt[0]), sa = std::sin(tilt[0]);
        const T cb = std::cos(tilt[1]), sb = std::sin(tilt[1]);
        const T rows[9] = {cb, T(0), sb, sa * sb, ca, -sa * cb, -ca * sb, sa, ca * cb};
        std::copy(rows, rows + 9, G);
      }
      const T n[3] = {G[2], G[5], G[8]};
      const T t1[3] = {G[0], G[3], G[6]};
      const T t2[3] = {G[1], G[4], G[7]};
      const T height = P_h.at(s)[0];
      const T* local = P_points.at(s);
      const T* radius = P_radii.at(s);
      // body-axes normal and tangents: J rows are [d_b, r x d_b] for body-axes direction d_b
      T dirs_b[9];
      const T* dirs[3] = {n, t1, t2};
      for (int d = 0; d < 3; ++d) {
        for (int a = 0; a < 3; ++a) {
          dirs_b[3 * d + a] = R[a] * dirs[d][0] + R[3 + a] * dirs[d][1] + R[6 + a] * dirs[d][2];
        }
      }
      std::vector<T> J(m * 6), phi(K);
      for (int64_t c = 0; c < K; ++c) {
        const T* r0 = local + 3 * c;
        T world[3], r[3];
        for (int a = 0; a < 3; ++a) {
          world[a] = R[3 * a] * r0[0] + R[3 * a + 1] * r0[1] + R[3 * a + 2] * r0[2] + qs[a];
        }
        T ph = world[0] * n[0] + world[1] * n[1] + world[2] * n[2] - height;
        const T rad = radius[c];
        if (rad != 0) {
          ph -= rad;
          for (int a = 0; a < 3; ++a) world[a] -= rad * n[a];
        }
        // the contact point relative to the body origin, in body axes
        for (int a = 0; a < 3; ++a) {
          r[a] = R[a] * (world[0] - qs[0]) + R[3 + a] * (world[1] - qs[1]) +
                 R[6 + a] * (world[2] - qs[2]);
        }
        phi[c] = ph;
        ophi[s * K + c] = ph;
        for (int a = 0; a < 3; ++a) {
          opt[(s * K + c) * 3 + a] = world[a];
          on[(s * K + c) * 3 + a] = n[a];
          ot[(s * K + c) * 6 + a] = t1[a];
          ot[(s * K + c) * 6 + 3 + a] = t2[a];
        }
        for (int d = 0; d < 3; ++d) {
          T* row = J.data() + (3 * c + d) * 6;
          std::copy(dirs_b + 3 * d, dirs_b + 3 * d + 3, row);
          cross(r, dirs_b + 3 * d, row + 3);
          T* out = d == 0 ? oJn + (s * K + c) * 6 : oJt + (s * K + c) * 12 + (d - 1) * 6;
          std::copy(row, row + 6, out);
        }
      }
      // free_velocity: M (crba) and h = rnea(q, v, 0) of one free body, [linear; angular].
      const T* pi = P_inertial.at(s);
      const T* arm = P_armature.at(s);
      const T mass = pi[0];
      const T mc[3] = {pi[1], pi[2], pi[3]};
      const T I[9] = {pi[4], pi[5], pi[6], pi[5], pi[7], pi[8], pi[6], pi[8], pi[9]};
      T M[36];
      std::fill(M, M + 36, T(0));
      for (int a = 0; a < 3; ++a) {
        M[a * 6 + a] = mass;
        for (int b = 0; b < 3; ++b) M[(3 + a) * 6 + 3 + b] = I[3 * a + b];
      }
      const T skew[9] = {0, -mc[2], mc[1], mc[2], 0, -mc[0], -mc[1], mc[0], 0};
      for (int a = 0; a < 3; ++a) {
        for (int b = 0; b < 3; ++b) {
          M[(3 + a) * 6 + b] = skew[3 * a + b];   // [m c]x
          M[a * 6 + 3 + b] = -skew[3 * a + b];    // -[m c]x
        }
      }
      for (int a = 0; a < 6; ++a) M[a * 6 + a] += arm[a];
      const T* lin = vs;
      const T* ang = vs + 3;
      T p_lin[3], L[3], wxc[3], cxv[3], g_b[3];
      cross(ang, mc, wxc);
      cross(mc, lin, cxv);
      for (int a = 0; a < 3; ++a) {
        p_lin[a] = mass * lin[a] + wxc[a];
        L[a] = cxv[a] + I[3 * a] * ang[0] + I[3 * a + 1] * ang[1] + I[3 * a + 2] * ang[2];
      }
      const T* grav = P_gravity.at(s);
      for (int a = 0; a < 3; ++a) g_b[a] = R[a] * grav[0] + R[3 + a] * grav[1] + R[6 + a] * grav[2];
      T wxp[3], wxL[3], vxp[3], cxg[3];
      cross(ang, p_lin, wxp);
      cross(ang, L, wxL);
      cross(lin, p_lin, vxp);
      cross(mc, g_b, cxg);
      T h[6];
      for (int a = 0; a < 3; ++a) {
        h[a] = wxp[a] - mass * g_b[a];
        h[3 + a] = wxL[a] + vxp[a] - cxg[a];
      }
      if (!cholesky6(M)) {
        int64_t expected = 0;
        status.compare_exchange_strong(expected, 2);
        return;
      }
      const T* ts = ptau + 6 * s;
      T acc[6];
      if (method == 1) {
        // _compliant: forces of compliant_contact_force added to tau
        const T k = P_k.at(s)[0], damp = P_c.at(s)[0], vsl = P_vs.at(s)[0];
        const T mu = P_mu.at(s)[0];
        for (int a = 0; a < 6; ++a) acc[a] = ts[a] - h[a];
        for (int64_t c = 0; c < K; ++c) {
          T vel[3];
          for (int d = 0; d < 3; ++d) {
            const T* row = J.data() + (3 * c + d) * 6;
            T x = 0;
            for (int a = 0; a < 6; ++a) x += row[a] * vs[a];
            vel[d] = x;
          }
          const T depth = std::max(-phi[c], T(0));
          const T f_n = depth > 0 ? std::max(k * depth - damp * vel[0], T(0)) : T(0);
          const T speed = std::sqrt(vel[1] * vel[1] + vel[2] * vel[2] + vsl * vsl);
          const T f[3] = {f_n, -(mu * f_n / speed) * vel[1], -(mu * f_n / speed) * vel[2]};
          for (int d = 0; d < 3; ++d) {
            oimp[(s * K + c) * 3 + d] = f[d] * dt;
            const T* row = J.data() + (3 * c + d) * 6;
            for (int a = 0; a < 6; ++a) acc[a] += row[a] * f[d];
          }
        }
      } else {
        for (int a = 0; a < 6; ++a) acc[a] = ts[a] - h[a];
      }
      cholesky6_solve(M, acc);
      T vn[6];  // v + dt M^-1 (tau - h) + momentum_hold
      T hold[3];
      cross(ang, lin, hold);
      for (int a = 0; a < 6; ++a) vn[a] = vs[a] + dt * acc[a];
      for (int a = 0; a < 3; ++a) vn[a] += dt * hold[a];
      if (method == 0) {
        // _complementarity
        std::vector<T> MinvJt(6 * m), A(m * m), b(m), mu(K), lam(m);
        for (int64_t j = 0; j < m; ++j) {
          T col[6];
          std::copy(J.data() + j * 6, J.data() + j * 6 + 6, col);
          cholesky6_solve(M, col);
          for (int a = 0; a < 6; ++a) MinvJt[a * m + j] = col[a];
        }
        T diag = 0;
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < m; ++j) {
            T x = 0;
            for (int a = 0; a < 6; ++a) x += J[i * 6 + a] * MinvJt[a * m + j];
            A[i * m + j] = x;
          }
          diag += A[i * m + i];
        }
        diag = regularization * (diag / static_cast<T>(m));
        for (int64_t i = 0; i < m; ++i) A[i * m + i] += diag;
        const T e = P_e.at(s)[0];
        for (int64_t c = 0; c < K; ++c) {
          mu[c] = P_mu.at(s)[0];
          T v_n = 0;
          for (int a = 0; a < 6; ++a) v_n += J[3 * c * 6 + a] * vs[a];
          const bool closing = phi[c] + dt * v_n <= 0;
          const T bounce = closing ? e * std::max(-v_n, T(0)) : T(0);
          for (int d = 0; d < 3; ++d) {
            T x = 0;
            for (int a = 0; a < 6; ++a) x += J[(3 * c + d) * 6 + a] * vn[a];
            b[3 * c + d] = x + (d == 0 ? phi[c] / dt - bounce : T(0));
          }
        }
        solve_sample<T>(A.data(), b.data(), mu.data(), m, tol, max_iter, lam.data());
        for (int a = 0; a < 6; ++a) {
          T x = 0;
          for (int64_t j = 0; j < m; ++j) x += MinvJt[a * m + j] * lam[j];
          vn[a] += x;
        }
        std::copy(lam.begin(), lam.end(), oimp + s * m);
      }
      // semi_implicit_update
      T turn[4], quat_next[4], conj[4], w_dt[3], moved[3], lin_next[3];
      for (int a = 0; a < 3; ++a) w_dt[a] = dt * vn[3 + a];
      quat_exp(w_dt, turn);
      {
        T uv[3];
        cross(quat, turn, uv);
        for (int a = 0; a < 3; ++a) quat_next[a] = quat[3] * turn[a] + turn[3] * quat[a] + uv[a];
        quat_next[3] = quat[3] * turn[3] -
                       (quat[0] * turn[0] + quat[1] * turn[1] + quat[2] * turn[2]);
        const T norm = std::sqrt(quat_next[0] * quat_next[0] + quat_next[1] * quat_next[1] +
                                 quat_next[2] * quat_next[2] + quat_next[3] * quat_next[3]);
        for (int a = 0; a < 4; ++a) quat_next[a] /= norm;
      }
      quat_rotate(quat, vn, moved);
      conj[0] = -turn[0], conj[1] = -turn[1], conj[2] = -turn[2], conj[3] = turn[3];
      quat_rotate(conj, vn, lin_next);
      T* qo = oq + 7 * s;
      T* vo = ov + 6 * s;
      for (int a = 0; a < 3; ++a) qo[a] = qs[a] + dt * moved[a];
      for (int a = 0; a < 4; ++a) qo[3 + a] = quat_next[a];
      for (int a = 0; a < 3; ++a) vo[a] = lin_next[a], vo[3 + a] = vn[3 + a];
    });
  });
  return {{q_next, v_next, impulses, phi_out, normal_out, tangents_out, point_out, Jn_out, Jt_out},
          status.load()};
}

int64_t threads_for(int64_t batch, int64_t m) { return split_for(batch, batch * m * m).threads; }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("cone_solve", &cone_solve, "APGD + Newton solutions of N contact cone problems");
  m.def("cone_backward", &cone_backward,
        "implicit gradients (A, b, mu) of the cone problems at their solutions");
  m.def("free_body_step", &free_body_step,
        "one contact step of free rigid bodies against the ground, without gradients");
  m.def("threads_for", &threads_for, "threads a call of batch problems of m rows runs on");
}
