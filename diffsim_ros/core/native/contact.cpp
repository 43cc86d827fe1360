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

int64_t threads_for(int64_t batch, int64_t m) { return split_for(batch, batch * m * m).threads; }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("cone_solve", &cone_solve, "APGD + Newton solutions of N contact cone problems");
  m.def("cone_backward", &cone_backward,
        "implicit gradients (A, b, mu) of the cone problems at their solutions");
  m.def("threads_for", &threads_for, "threads a call of batch problems of m rows runs on");
}
