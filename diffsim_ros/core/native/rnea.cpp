// Fused per-sample rigid-body dynamics kernels for diffsim_ros.core.native.
//
// One sample's whole recursion runs in a small per-thread workspace that stays in L1, instead
// of streaming (B, n, ...) intermediates through memory once per tensor operation.  The
// kernels work in body coordinates (Featherstone): joint i's child frame is body i, the base
// frame is the world frame, spatial vectors are [angular; linear] (the CRBA parameter
// gradient alone accumulates in world coordinates, where every body shares its columns).
//
// Per-sample parameters (inertial, joint origins, armature, gravity) are given either with
// exactly one row of values (shared by the whole batch, any shape, e.g. model.inertial as it
// is) or with one row per sample.  Gradients come back in the parameter's own shape: summed
// over the batch for a shared parameter, per sample otherwise.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

namespace {

constexpr int64_t kMinSamplesPerChunk = 16;
constexpr int64_t kMinWorkPerThread = 2048;
// Chunks per thread: dynamic scheduling over several chunks keeps both cores busy when the
// machine is shared and one thread gets descheduled.
constexpr int64_t kChunksPerThread = 8;

// Joint type code of a free-flyer root (joint 0 only) in Tree::prismatic.
constexpr int64_t kFreeFlyer = 2;

// Structure of the tree, shared by every sample.  A floating tree (Pinocchio's free-flyer as
// joint 0) has q = [p (3), quaternion x, y, z, w (4), joint positions] (nq = n + 6) and
// v = [linear; angular velocity in root axes, joint rates] (nv = n + 5): 1-DOF joint i > 0
// reads q[qo + i] and v[vo + i], the root reads q[0:7] and v[0:6].
struct Tree {
  int64_t n;                 // bodies (joints, the root included)
  const int64_t* parent;     // (n,), -1 for the base
  const int64_t* prismatic;  // (n,), 1 prismatic, 0 revolute/continuous, kFreeFlyer root
  bool floating;
  int64_t nq, nv, qo, vo;
  // Body of velocity coordinate j.
  int64_t body_of(int64_t j) const { return floating ? std::max<int64_t>(j - vo, 0) : j; }
};

// Strided view of a parameter given with one row (shared, stride 0) or one row per sample.
template <typename T>
struct Param {
  const T* data;
  int64_t stride;
  const T* at(int64_t b) const { return data + b * stride; }
};

template <typename T>
Param<T> param(const torch::Tensor& x, int64_t batch, int64_t row, const char* name) {
  TORCH_CHECK(x.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(x.numel() == row || x.numel() == batch * row, name, " has ", x.numel(),
              " values; expected ", row, " (shared) or ", batch * row, " (one row per sample)");
  return Param<T>{x.data_ptr<T>(), x.numel() == row ? 0 : row};
}

template <typename T>
inline void cross(const T* a, const T* b, T* out) {
  out[0] = a[1] * b[2] - a[2] * b[1];
  out[1] = a[2] * b[0] - a[0] * b[2];
  out[2] = a[0] * b[1] - a[1] * b[0];
}

// Pose of body i in its parent: rotation R (row-major 3x3) and translation p.
template <typename T>
inline void joint_pose(const T* origin, const T* axis, bool prismatic, T q, T* R, T* p) {
  // origin: row-major 4x4 T_parent_joint at q = 0.
  for (int r = 0; r < 3; ++r) p[r] = origin[4 * r + 3];
  if (prismatic) {
    for (int r = 0; r < 3; ++r) {
      for (int c = 0; c < 3; ++c) R[3 * r + c] = origin[4 * r + c];
      p[r] += q * (origin[4 * r] * axis[0] + origin[4 * r + 1] * axis[1] +
                   origin[4 * r + 2] * axis[2]);
    }
    return;
  }
  // Rodrigues: Rj = E + s K + (1 - c) K^2 with K = skew(axis), K^2 = a a^T - |a|^2 E.
  const T s = std::sin(q), t = T(1) - std::cos(q);
  const T x = axis[0], y = axis[1], z = axis[2];
  const T aa = x * x + y * y + z * z;
  T Rj[9] = {
      T(1) + t * (x * x - aa), -s * z + t * x * y, s * y + t * x * z,
      s * z + t * x * y, T(1) + t * (y * y - aa), -s * x + t * y * z,
      -s * y + t * x * z, s * x + t * y * z, T(1) + t * (z * z - aa)};
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) {
      R[3 * r + c] = origin[4 * r] * Rj[c] + origin[4 * r + 1] * Rj[3 + c] +
                     origin[4 * r + 2] * Rj[6 + c];
    }
  }
}

// Motion vector from parent to child coordinates: [R^T w; R^T (v - p x w)].
template <typename T>
inline void motion_to_child(const T* R, const T* p, const T* m, T* out) {
  T pxw[3];
  cross(p, m, pxw);
  const T l[3] = {m[3] - pxw[0], m[4] - pxw[1], m[5] - pxw[2]};
  for (int c = 0; c < 3; ++c) {
    out[c] = R[c] * m[0] + R[3 + c] * m[1] + R[6 + c] * m[2];
    out[3 + c] = R[c] * l[0] + R[3 + c] * l[1] + R[6 + c] * l[2];
  }
}

// A body's motion carried over from its parent's, zero at a root: the start of the outward
// recursions without a root term (velocities, gradient propagations, M g).
template <typename T>
inline void from_parent(const T* R, const T* p, int64_t parent, const T* motions, T* out) {
  if (parent < 0) {
    for (int r = 0; r < 6; ++r) out[r] = T(0);
  } else {
    motion_to_child(R, p, motions + 6 * parent, out);
  }
}

// Force vector from child to parent coordinates: [R n + p x (R f); R f]; added to out.
template <typename T>
inline void add_force_to_parent(const T* R, const T* p, const T* f, T* out) {
  T Rn[3], Rf[3], pxRf[3];
  for (int r = 0; r < 3; ++r) {
    Rn[r] = R[3 * r] * f[0] + R[3 * r + 1] * f[1] + R[3 * r + 2] * f[2];
    Rf[r] = R[3 * r] * f[3] + R[3 * r + 1] * f[4] + R[3 * r + 2] * f[5];
  }
  cross(p, Rf, pxRf);
  for (int r = 0; r < 3; ++r) {
    out[r] += Rn[r] + pxRf[r];
    out[3 + r] += Rf[r];
  }
}

// Spatial inertia from pi = [m, hx, hy, hz, Ixx, Ixy, Ixz, Iyy, Iyz, Izz] times a motion
// vector: [I w + h x v; m v - h x w].
template <typename T>
inline void inertia_apply(const T* pi, const T* m, T* out) {
  const T* h = pi + 1;
  T hxv[3], hxw[3];
  cross(h, m + 3, hxv);
  cross(h, m, hxw);
  out[0] = pi[4] * m[0] + pi[5] * m[1] + pi[6] * m[2] + hxv[0];
  out[1] = pi[5] * m[0] + pi[7] * m[1] + pi[8] * m[2] + hxv[1];
  out[2] = pi[6] * m[0] + pi[8] * m[1] + pi[9] * m[2] + hxv[2];
  for (int r = 0; r < 3; ++r) out[3 + r] = pi[0] * m[3 + r] - hxw[r];
}

// Spatial motion cross product v x m.
template <typename T>
inline void motion_cross(const T* v, const T* m, T* out) {
  T a[3], b[3];
  cross(v, m, out);
  cross(v, m + 3, a);
  cross(v + 3, m, b);
  for (int r = 0; r < 3; ++r) out[3 + r] = a[r] + b[r];
}

// Spatial force cross product v x* f, added to out.
template <typename T>
inline void add_force_cross(const T* v, const T* f, T* out) {
  T a[3], b[3], c[3];
  cross(v, f, a);
  cross(v + 3, f + 3, b);
  cross(v, f + 3, c);
  for (int r = 0; r < 3; ++r) {
    out[r] += a[r] + b[r];
    out[3 + r] += c[r];
  }
}

// out += scale * phi(a, b), where a^T I(pi) b = phi(a, b) . pi.
template <typename T>
inline void add_phi(const T* a, const T* b, T scale, T* out) {
  T c1[3], c2[3];
  cross(b + 3, a, c1);
  cross(a + 3, b, c2);
  out[0] += scale * (a[3] * b[3] + a[4] * b[4] + a[5] * b[5]);
  for (int r = 0; r < 3; ++r) out[1 + r] += scale * (c1[r] + c2[r]);
  out[4] += scale * a[0] * b[0];
  out[5] += scale * (a[0] * b[1] + a[1] * b[0]);
  out[6] += scale * (a[0] * b[2] + a[2] * b[0]);
  out[7] += scale * a[1] * b[1];
  out[8] += scale * (a[1] * b[2] + a[2] * b[1]);
  out[9] += scale * a[2] * b[2];
}

// Joint motion subspace S = [axis; 0] (revolute) or [0; axis] (prismatic) times x, added.
template <typename T>
inline void add_subspace(const T* axis, bool prismatic, T x, T* out) {
  const int o = prismatic ? 3 : 0;
  for (int r = 0; r < 3; ++r) out[o + r] += axis[r] * x;
}

template <typename T>
inline T subspace_dot(const T* axis, bool prismatic, const T* f) {
  const int o = prismatic ? 3 : 0;
  return axis[0] * f[o] + axis[1] * f[o + 1] + axis[2] * f[o + 2];
}

// The free-flyer's motion subspace in root coordinates is a permutation: v[0:6] = [linear;
// angular] is the root body's spatial velocity [angular; linear].  Spatial index of
// coordinate r: kRootRow[r].
constexpr int kRootRow[6] = {3, 4, 5, 0, 1, 2};

// out += S0 x (x in v order).
template <typename T>
inline void add_root_motion(const T* x, T* out) {
  for (int r = 0; r < 3; ++r) {
    out[r] += x[3 + r];
    out[3 + r] += x[r];
  }
}

// Rotation matrix (row-major) of the quaternion (x, y, z, w) / |quat|, as
// spatial.quat_to_matrix: I + s A(quat) with s = 2 / |quat|^2.
template <typename T>
inline void quat_matrix(const T* quat, T* R) {
  const T x = quat[0], y = quat[1], z = quat[2], w = quat[3];
  const T s = T(2) / (x * x + y * y + z * z + w * w);
  R[0] = T(1) - s * (y * y + z * z);
  R[1] = s * (x * y - w * z);
  R[2] = s * (x * z + w * y);
  R[3] = s * (x * y + w * z);
  R[4] = T(1) - s * (x * x + z * z);
  R[5] = s * (y * z - w * x);
  R[6] = s * (x * z - w * y);
  R[7] = s * (y * z + w * x);
  R[8] = T(1) - s * (x * x + y * y);
}

// out (4) += scale * d(h^T R(quat) u)/d quat for quat_matrix's R, through the normalisation
// (the gradient is tangent to the sphere |quat| = const, as torch's through q / |q|).  With
// G = h u^T, R = I + s A: d/dq_k = s G:dA/dq_k - (2 s q_k / |q|^2) G:A.
template <typename T>
inline void add_quat_grad(const T* quat, const T* h, const T* u, T scale, T* out) {
  const T x = quat[0], y = quat[1], z = quat[2], w = quat[3];
  const T norm2 = x * x + y * y + z * z + w * w;
  const T s = T(2) / norm2;
  T G[9];
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) G[3 * r + c] = h[r] * u[c];
  }
  const T GA = -G[0] * (y * y + z * z) + G[1] * (x * y - w * z) + G[2] * (x * z + w * y) +
               G[3] * (x * y + w * z) - G[4] * (x * x + z * z) + G[5] * (y * z - w * x) +
               G[6] * (x * z - w * y) + G[7] * (y * z + w * x) - G[8] * (x * x + y * y);
  const T dA[4] = {
      G[1] * y + G[2] * z + G[3] * y - T(2) * G[4] * x - G[5] * w + G[6] * z + G[7] * w -
          T(2) * G[8] * x,
      -T(2) * G[0] * y + G[1] * x + G[2] * w + G[3] * x + G[5] * z - G[6] * w + G[7] * z -
          T(2) * G[8] * y,
      -T(2) * G[0] * z - G[1] * w + G[2] * x + G[3] * w - T(2) * G[4] * z + G[5] * y +
          G[6] * x + G[7] * y,
      -G[1] * z + G[2] * y + G[3] * z - G[5] * x - G[6] * y + G[7] * x};
  for (int k = 0; k < 4; ++k) out[k] += scale * (s * dA[k] - T(2) * s * quat[k] / norm2 * GA);
}

// Pose of the free-flyer's body in the world: T_origin T(q[0:7]) (kinematics.joint_transforms).
template <typename T>
inline void root_pose(const T* origin, const T* q, T* R, T* p) {
  T Rq[9];
  quat_matrix(q + 3, Rq);
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) {
      R[3 * r + c] = origin[4 * r] * Rq[c] + origin[4 * r + 1] * Rq[3 + c] +
                     origin[4 * r + 2] * Rq[6 + c];
    }
    p[r] = origin[4 * r + 3] + origin[4 * r] * q[0] + origin[4 * r + 1] * q[1] +
           origin[4 * r + 2] * q[2];
  }
}

// The free-flyer's position adjoint: only gravity reaches the root's pose in body coordinates,
// as a_0 = [0; R0^T (-g)] + S0 qdd[0:6].  With ag = R0^T (-g) = a_0[3:6] - qdd[0:3] and
// R0 = Ro Rq: abar_0 . a_0 depends on the quaternion through (Rq ag)^T Rq abar_0[3:6] (Rq ag =
// Ro^T (-g) is constant); the position q[0:3] does not enter.
template <typename T>
inline void add_root_position_grad(const T* q, const T* a0, const T* qdd, const T* abar0,
                                   T scale, T* gq) {
  T Rq[9], h[3];
  quat_matrix(q + 3, Rq);
  const T ag[3] = {a0[3] - qdd[0], a0[4] - qdd[1], a0[5] - qdd[2]};
  for (int r = 0; r < 3; ++r) {
    h[r] = Rq[3 * r] * ag[0] + Rq[3 * r + 1] * ag[1] + Rq[3 * r + 2] * ag[2];
  }
  add_quat_grad(q + 3, h, abar0 + 3, scale, gq + 3);
}

// Per-sample kinematics: poses R (9n), p (3n), velocities v (6n) and accelerations a (6n),
// the first kKinRow * n values of a saved row.  The forward kernels write them where the
// backward kernels can read them again, so a backward pass recomputes no pose (no sin/cos).
constexpr int64_t kKinRow = 24;
// RNEA additionally saves the forces F_i its backward sweep transmits (6n), which the
// position adjoint reads: kRneaRow * n values.
constexpr int64_t kRneaRow = 30;
// ABA additionally saves U = IA_i S_i (6n) and D_i (n), all M^-1 needs: kAbaRow * n values.
constexpr int64_t kAbaRow = 31;

template <typename T>
struct Kin {
  T *R, *p, *v, *a;
  Kin(T* row, int64_t n) : R(row), p(row + 9 * n), v(row + 12 * n), a(row + 18 * n) {}
};

// Rows for samples whose kinematics are not saved: one per thread, reused.
template <typename T>
struct Scratch {
  std::vector<T> buffer;  // one allocation: the row, then the forces f (6n)
  int64_t f_offset;
  Scratch(int64_t n, int64_t row_size) : buffer((row_size + 6) * n), f_offset(row_size * n) {}
  T* row() { return buffer.data(); }
  T* f() { return buffer.data() + f_offset; }
};

// The free-flyer's pose, velocity and acceleration (kinematics_pass's body 0): v_0 = S0 v[0:6],
// a_0 = X_0 a_g + S0 qdd[0:6] (the root's bias v_0 x S0 v[0:6] = v_0 x v_0 vanishes).
template <typename T>
inline void root_kinematics(const T* origin, const T* q, const T* qd, const T* qdd,
                            const T* gravity, const Kin<T>& k) {
  root_pose(origin, q, k.R, k.p);
  const T a0[6] = {T(0), T(0), T(0), -gravity[0], -gravity[1], -gravity[2]};
  for (int r = 0; r < 6; ++r) k.v[r] = T(0);
  add_root_motion(qd, k.v);
  motion_to_child(k.R, k.p, a0, k.a);
  add_root_motion(qdd, k.a);
}

// First pass of RNEA: poses, v_i, a_i (with gravity as the base acceleration).
template <typename T>
inline void kinematics_pass(const Tree& tree, const T* axis, const T* origins, const T* q_all,
                            const T* qd_all, const T* qdd_all, const T* gravity,
                            const Kin<T>& k) {
  if (tree.floating) root_kinematics(origins, q_all, qd_all, qdd_all, gravity, k);
  const T *q = q_all + tree.qo, *qd = qd_all + tree.vo, *qdd = qdd_all + tree.vo;
  for (int64_t i = tree.floating ? 1 : 0; i < tree.n; ++i) {
    const bool pr = tree.prismatic[i] != 0;
    const T* ax = axis + 3 * i;
    T* R = k.R + 9 * i;
    T* p = k.p + 3 * i;
    T* v = k.v + 6 * i;
    T* a = k.a + 6 * i;
    joint_pose(origins + 16 * i, ax, pr, q[i], R, p);
    const int64_t parent = tree.parent[i];
    if (parent < 0) {
      const T a0[6] = {T(0), T(0), T(0), -gravity[0], -gravity[1], -gravity[2]};
      for (int r = 0; r < 6; ++r) v[r] = T(0);
      motion_to_child(R, p, a0, a);
    } else {
      motion_to_child(R, p, k.v + 6 * parent, v);
      motion_to_child(R, p, k.a + 6 * parent, a);
    }
    T sqd[6] = {T(0), T(0), T(0), T(0), T(0), T(0)};
    add_subspace(ax, pr, qd[i], sqd);
    add_subspace(ax, pr, qd[i], v);
    add_subspace(ax, pr, qdd[i], a);
    T c[6];
    motion_cross(v, sqd, c);
    for (int r = 0; r < 6; ++r) a[r] += c[r];
  }
}

// The free-flyer's entries of tau: S0^T F_0 (the wrench [force; torque] in root axes about
// the root origin) plus armature * qdd.
template <typename T>
inline void root_torque(const T* F0, const T* armature, const T* qdd, T* tau) {
  for (int r = 0; r < 6; ++r) tau[r] = F0[kRootRow[r]] + armature[r] * qdd[r];
}

template <typename T>
void rnea_sample(const Tree& tree, const T* axis, const T* origins, const T* pi,
                 const T* armature, const T* gravity, const T* q, const T* qd, const T* qdd,
                 T* tau, const Kin<T>& k, T* f) {
  kinematics_pass(tree, axis, origins, q, qd, qdd, gravity, k);
  for (int64_t i = 0; i < tree.n; ++i) {
    T Iv[6];
    inertia_apply(pi + 10 * i, k.a + 6 * i, f + 6 * i);
    inertia_apply(pi + 10 * i, k.v + 6 * i, Iv);
    add_force_cross(k.v + 6 * i, Iv, f + 6 * i);
  }
  const int64_t o = tree.vo;
  for (int64_t i = tree.n - 1; i >= 0; --i) {
    const int64_t parent = tree.parent[i];
    if (parent < 0 && tree.floating) {
      root_torque(f, armature, qdd, tau);
      continue;
    }
    const bool pr = tree.prismatic[i] != 0;
    tau[o + i] = subspace_dot(axis + 3 * i, pr, f + 6 * i) + armature[o + i] * qdd[o + i];
    if (parent >= 0) add_force_to_parent(k.R + 9 * i, k.p + 3 * i, f + 6 * i, f + 6 * parent);
  }
}

// S x m for the joint's unit subspace S: [a x m_w; a x m_v] (revolute) or [0; a x m_w].
template <typename T>
inline void subspace_cross(const T* axis, bool prismatic, const T* m, T* out) {
  if (prismatic) {
    out[0] = out[1] = out[2] = T(0);
    cross(axis, m, out + 3);
  } else {
    cross(axis, m, out);
    cross(axis, m + 3, out + 3);
  }
}

// (S x) x* f added to out: [x a x f_n; x a x f_f] (revolute) or [x a x f_f; 0].
template <typename T>
inline void add_subspace_force_cross(const T* axis, bool prismatic, T x, const T* f, T* out) {
  T c[3];
  cross(axis, f + 3, c);
  if (prismatic) {
    for (int r = 0; r < 3; ++r) out[r] += x * c[r];
    return;
  }
  T d[3];
  cross(axis, f, d);
  for (int r = 0; r < 3; ++r) {
    out[r] += x * d[r];
    out[3 + r] += x * c[r];
  }
}

template <typename T>
inline T dot6(const T* a, const T* b) {
  return a[0] * b[0] + a[1] * b[1] + a[2] * b[2] + a[3] * b[3] + a[4] * b[4] + a[5] * b[5];
}

// The forces F_i joint i transmits to body i (6n), from the kinematics k: f_i = I a_i +
// v_i x* I v_i, summed over the subtree of i.
template <typename T>
void transmitted_forces(const Tree& tree, const T* pi, const Kin<T>& k, T* f) {
  for (int64_t i = 0; i < tree.n; ++i) {
    T Iv[6];
    inertia_apply(pi + 10 * i, k.a + 6 * i, f + 6 * i);
    inertia_apply(pi + 10 * i, k.v + 6 * i, Iv);
    add_force_cross(k.v + 6 * i, Iv, f + 6 * i);
  }
  for (int64_t i = tree.n - 1; i >= 0; --i) {
    const int64_t parent = tree.parent[i];
    if (parent >= 0) add_force_to_parent(k.R + 9 * i, k.p + 3 * i, f + 6 * i, f + 6 * parent);
  }
}

// Workspace of rnea_adjoint_sample: total forces F, force adjoints w, acceleration and
// velocity adjoints (6n each).
constexpr int64_t kAdjointWork = 24;

// Reverse-mode adjoint of rnea_sample for the upstream gradient g (n), at the saved poses,
// velocities and accelerations k: adds scale * d(g . tau)/dx to gq, gqd (x = q, qd) and
// gpi (n, 10), and writes d(g . tau)/d qdd = M g (armature included) to gqdd; null outputs
// are skipped.  saved_F: the transmitted forces F_i when the forward pass kept them, else
// null (computed here from k when gq is asked for).  Joint i moves its body by X_i(q_i)
// with dX_i/dq_i = -S_i x X_i, so with z = X_i (parent's motion):
//  - tau_i = S_i . F_i, F_parent += X_i^T F_i: the force adjoint w_i = X_i w_parent + S_i g_i
//    (propagated like a velocity), and q_i gets -(S_i x X_i w_parent) . F_i;
//  - f_i = I a_i + v_i x* I v_i: abar_i = I w_i (+ children), vbar_i -= w_i x* I v_i +
//    I (v_i x w_i);
//  - a_i = X_i a_parent + S_i qdd_i + v_i x S_i qd_i: qd_i gets abar_i . (v_i x S_i),
//    vbar_i += S_i qd_i x* abar_i, q_i gets -abar_i . (S_i x z), abar_parent += X_i^T abar_i;
//  - v_i = X_i v_parent + S_i qd_i: qd_i gets S_i . vbar_i, q_i gets -vbar_i . (S_i x z),
//    vbar_parent += X_i^T vbar_i.
// ws: kAdjointWork * n values.  first: g vanishes on every body before it (bodies are
// numbered parents first), so w_i = 0 there and the sweep skips those terms (a unit vector
// e_j of rnea_derivatives passes the body of j).
// A free-flyer root (tree.floating): g, gqd, gqdd, armature, qd, qdd are nv long and gq nq
// long; the root's force adjoint starts as w_0 = S0 g[0:6], it has no bias term, and its
// position adjoint is add_root_position_grad's (q: the configurations, read for the root
// only; may be null on a fixed base).
template <typename T>
void rnea_adjoint_sample(const Tree& tree, const T* axis, const Kin<T>& k, const T* saved_F,
                         const T* pi, const T* armature, const T* q, const T* qd_all,
                         const T* qdd_all, const T* g_all, T scale, T* gq_all, T* gqd_all,
                         T* gqdd_all, T* gpi, T* ws, int64_t first = 0) {
  const int64_t n = tree.n;
  const bool floating = tree.floating;
  const int64_t o = tree.vo;
  // joint i > 0 (all joints of a fixed base) reads entry o + i of the nv-long vectors
  const T *qd = qd_all + o, *qdd = qdd_all + o, *g = g_all + o, *arm = armature + o;
  T* gq = gq_all == nullptr ? nullptr : gq_all + tree.qo;
  T* gqd = gqd_all == nullptr ? nullptr : gqd_all + o;
  T* gqdd = gqdd_all == nullptr ? nullptr : gqdd_all + o;
  T* w = ws + 6 * n;
  T* abar = ws + 12 * n;
  T* vbar = ws + 18 * n;
  const bool state = gq != nullptr || gqd != nullptr;
  const T* F = saved_F;
  if (F == nullptr && gq != nullptr) {
    transmitted_forces(tree, pi, k, ws);
    F = ws;
  }
  for (int64_t i = 0; i < n; ++i) {
    const bool pr = tree.prismatic[i] != 0;
    T* wi = w + 6 * i;
    if (i < first) {   // g vanishes here and on every ancestor: so do w_i and its terms
      for (int r = 0; r < 6; ++r) wi[r] = T(0);
      continue;
    }
    from_parent(k.R + 9 * i, k.p + 3 * i, tree.parent[i], w, wi);
    if (floating && i == 0) {
      add_root_motion(g_all, wi);
    } else {
      if (gq != nullptr && tree.parent[i] >= 0) {
        T Sxy[6];
        subspace_cross(axis + 3 * i, pr, wi, Sxy);
        gq[i] -= scale * dot6(Sxy, F + 6 * i);
      }
      add_subspace(axis + 3 * i, pr, g[i], wi);
    }
    if (gpi != nullptr) {
      const T* v = k.v + 6 * i;
      T vxw[6];
      motion_cross(v, wi, vxw);
      add_phi(wi, k.a + 6 * i, scale, gpi + 10 * i);
      add_phi(vxw, v, -scale, gpi + 10 * i);
    }
  }
  if (!state && gqdd == nullptr) return;
  for (int64_t r = 0; r < 6 * n; ++r) abar[r] = vbar[r] = T(0);
  for (int64_t i = n - 1; i >= 0; --i) {
    const bool pr = tree.prismatic[i] != 0;
    const bool root = floating && i == 0;
    const T* ax = axis + 3 * i;
    const T* wi = w + 6 * i;
    T* ab = abar + 6 * i;
    const bool moving = i >= first;   // else w_i = 0 and the terms in w_i vanish
    if (moving) {
      T Iw[6];
      inertia_apply(pi + 10 * i, wi, Iw);
      for (int r = 0; r < 6; ++r) ab[r] += Iw[r];
    }
    if (gqdd != nullptr) {
      if (root) {
        for (int r = 0; r < 6; ++r) gqdd_all[r] = ab[kRootRow[r]] + armature[r] * g_all[r];
      } else {
        gqdd[i] = subspace_dot(ax, pr, ab) + arm[i] * g[i];
      }
    }
    const int64_t parent = tree.parent[i];
    if (state) {
      const T* v = k.v + 6 * i;
      T* vb = vbar + 6 * i;
      if (moving) {
        T Iv[6], t[6] = {T(0), T(0), T(0), T(0), T(0), T(0)}, vxw[6], Ivxw[6];
        inertia_apply(pi + 10 * i, v, Iv);
        add_force_cross(wi, Iv, t);
        motion_cross(v, wi, vxw);
        inertia_apply(pi + 10 * i, vxw, Ivxw);
        for (int r = 0; r < 6; ++r) vb[r] -= t[r] + Ivxw[r];
      }
      if (root) {
        // v_0 = S0 v[0:6], a_0 = X_0 a_g + S0 qdd[0:6]: no bias term
        if (gqd_all != nullptr) {
          for (int r = 0; r < 6; ++r) gqd_all[r] += scale * vb[kRootRow[r]];
        }
        if (gq_all != nullptr) add_root_position_grad(q, k.a, qdd_all, ab, scale, gq_all);
        continue;
      }
      add_subspace_force_cross(ax, pr, qd[i], ab, vb);
      // S x v = S x z_v (S x S = 0), with z_v = X_i v_parent = v_i - S qd_i
      T Sxv[6];
      subspace_cross(ax, pr, v, Sxv);
      if (gqd != nullptr) gqd[i] += scale * (subspace_dot(ax, pr, vb) - dot6(ab, Sxv));
      if (gq != nullptr) {
        // z_a = X_i a_parent = a_i - S qdd_i - v_i x S qd_i = a_i - S qdd_i + qd_i S x v_i
        T za[6], Sxa[6];
        for (int r = 0; r < 6; ++r) za[r] = k.a[6 * i + r] + qd[i] * Sxv[r];
        add_subspace(ax, pr, -qdd[i], za);
        subspace_cross(ax, pr, za, Sxa);
        gq[i] -= scale * (dot6(ab, Sxa) + dot6(vb, Sxv));
      }
      if (parent >= 0) add_force_to_parent(k.R + 9 * i, k.p + 3 * i, vb, vbar + 6 * parent);
    }
    if (parent >= 0) add_force_to_parent(k.R + 9 * i, k.p + 3 * i, ab, abar + 6 * parent);
  }
}

// ---------------------------------------------------------------------------------------
// Articulated-body algorithm
// ---------------------------------------------------------------------------------------

// Cholesky factor L (lower, row-major m x m) of the symmetric matrix A; false unless every
// pivot is finite and positive (numpy.linalg.cholesky's test).
template <typename T>
bool cholesky(const T* A, int64_t m, T* L) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      T s = A[i * m + j];
      for (int64_t k = 0; k < j; ++k) s -= L[i * m + k] * L[j * m + k];
      if (i == j) {
        if (!(s > T(0)) || !std::isfinite(s)) return false;
        L[i * m + i] = std::sqrt(s);
      } else {
        L[i * m + j] = s / L[j * m + j];
      }
    }
    for (int64_t j = i + 1; j < m; ++j) L[i * m + j] = T(0);
  }
  return true;
}

// Solves L L^T x = b in place.
template <typename T>
void cholesky_solve(const T* L, int64_t m, T* b) {
  for (int64_t i = 0; i < m; ++i) {
    T s = b[i];
    for (int64_t k = 0; k < i; ++k) s -= L[i * m + k] * b[k];
    b[i] = s / L[i * m + i];
  }
  for (int64_t i = m - 1; i >= 0; --i) {
    T s = b[i];
    for (int64_t k = i + 1; k < m; ++k) s -= L[k * m + i] * b[k];
    b[i] = s / L[i * m + i];
  }
}


// 6x6 spatial inertia (row-major) from pi.
template <typename T>
inline void spatial_inertia(const T* pi, T* M) {
  const T m = pi[0], hx = pi[1], hy = pi[2], hz = pi[3];
  const T I[36] = {
      pi[4], pi[5], pi[6], T(0), -hz, hy,
      pi[5], pi[7], pi[8], hz, T(0), -hx,
      pi[6], pi[8], pi[9], -hy, hx, T(0),
      T(0), hz, -hy, m, T(0), T(0),
      -hz, T(0), hx, T(0), m, T(0),
      hy, -hx, T(0), T(0), T(0), m};
  for (int k = 0; k < 36; ++k) M[k] = I[k];
}

// Y = R X R^T for 3x3 blocks (row-major, X read with row stride ld).
template <typename T>
inline void rotate_block(const T* R, const T* X, int ld, T* Y) {
  T RX[9];
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) {
      RX[3 * r + c] = R[3 * r] * X[c] + R[3 * r + 1] * X[ld + c] + R[3 * r + 2] * X[2 * ld + c];
    }
  }
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) {
      Y[3 * r + c] = RX[3 * r] * R[3 * c] + RX[3 * r + 1] * R[3 * c + 1] +
                     RX[3 * r + 2] * R[3 * c + 2];
    }
  }
}

// out += X^T M X with X the parent-to-child motion transform of (R, p): the articulated
// inertia M = [[A, B], [B^T, C]] (symmetric) of a child expressed in its parent.  With
// A', B', C' the blocks rotated by R, P = skew(p) and F = B' + P C':
// [[A' + P B'^T - F P, F], [F^T, C']].
template <typename T>
inline void add_inertia_to_parent(const T* R, const T* p, const T* M, T* out) {
  T A[9], B[9], C[9];
  rotate_block(R, M, 6, A);
  rotate_block(R, M + 3, 6, B);
  rotate_block(R, M + 21, 6, C);
  T PC[9], F[9];
  for (int c = 0; c < 3; ++c) {
    const T col[3] = {C[c], C[3 + c], C[6 + c]};
    T x[3];
    cross(p, col, x);
    for (int r = 0; r < 3; ++r) PC[3 * r + c] = x[r];
  }
  for (int k = 0; k < 9; ++k) F[k] = B[k] + PC[k];
  T FP[9], PBt[9];
  for (int r = 0; r < 3; ++r) {
    const T row[3] = {F[3 * r], F[3 * r + 1], F[3 * r + 2]};
    T x[3];
    cross(p, row, x);   // row r of F P is row^T P = -(p x row)^T
    for (int c = 0; c < 3; ++c) FP[3 * r + c] = -x[c];
    const T brow[3] = {B[3 * r], B[3 * r + 1], B[3 * r + 2]};
    cross(p, brow, x);  // column r of P B'^T = p x (row r of B')
    for (int c = 0; c < 3; ++c) PBt[3 * c + r] = x[c];
  }
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) {
      out[6 * r + c] += A[3 * r + c] + PBt[3 * r + c] - FP[3 * r + c];
      out[6 * r + 3 + c] += F[3 * r + c];
      out[6 * (3 + r) + c] += F[3 * c + r];
      out[6 * (3 + r) + 3 + c] += C[3 * r + c];
    }
  }
}

// Saved ABA row of a tree: kinematics, U, D per body, and for a free-flyer root the Cholesky
// factor (lower, row-major 6x6) of its articulated inertia S0^T IA_0 S0 + armature.
inline int64_t aba_row(const Tree& tree) {
  return kAbaRow * tree.n + (tree.floating ? 36 : 0);
}

// One allocation per call (a B = 1 call pays each one): the saved-row layout, then c (6n),
// IA (36n), pA (6n) and u (n).
template <typename T>
struct AbaScratch {
  std::vector<T> buffer;
  T *c, *IA, *pA, *u;
  explicit AbaScratch(const Tree& tree) : buffer(aba_row(tree) + 49 * tree.n) {
    c = buffer.data() + aba_row(tree);
    IA = c + 6 * tree.n;
    pA = IA + 36 * tree.n;
    u = pA + 6 * tree.n;
  }
  T* row() { return buffer.data(); }
};

// The free-flyer's step of ABA, after the backward sweep: solves (S0^T IA_0 S0 + armature)
// qdd[0:6] = tau[0:6] - S0^T (IA_0 a_g0 + pA_0) with a_g0 = X_0 a_g, writes its Cholesky factor
// to L and a_0 = a_g0 + S0 qdd[0:6] to k.a (NaN when IA_0 is not positive definite).
template <typename T>
void root_acceleration(const T* IA, const T* pA, const T* armature, const T* gravity,
                       const T* tau, T* qdd, const Kin<T>& k, T* L) {
  const T ag[6] = {T(0), T(0), T(0), -gravity[0], -gravity[1], -gravity[2]};
  T* a = k.a;
  motion_to_child(k.R, k.p, ag, a);
  T M[36];
  for (int r = 0; r < 6; ++r) {
    const T* row = IA + 6 * kRootRow[r];
    T f = pA[kRootRow[r]];
    for (int c = 0; c < 6; ++c) {
      M[6 * r + c] = row[kRootRow[c]] + (r == c ? armature[r] : T(0));
      f += row[c] * a[c];
    }
    qdd[r] = tau[r] - f;
  }
  if (!cholesky(M, 6, L)) {
    for (int r = 0; r < 6; ++r) qdd[r] = std::numeric_limits<T>::quiet_NaN();
  } else {
    cholesky_solve(L, 6, qdd);
  }
  add_root_motion(qdd, a);
}

// ABA for one sample; writes the kinematics, U and D into the row k / U / D point into (and
// a free-flyer's factor into root_L).
template <typename T>
void aba_sample(const Tree& tree, const T* axis, const T* origins, const T* pi,
                const T* armature, const T* gravity, const T* q_all, const T* qd_all,
                const T* tau_all, T* qdd_all, const Kin<T>& k, T* U_all, T* D_all, T* root_L,
                AbaScratch<T>& ws) {
  const int64_t n = tree.n;
  const bool floating = tree.floating;
  const int64_t o = tree.vo;
  const T *q = q_all + tree.qo, *qd = qd_all + o, *tau = tau_all + o, *arm = armature + o;
  T* qdd = qdd_all + o;
  for (int64_t i = 0; i < n; ++i) {
    const bool pr = tree.prismatic[i] != 0;
    const T* ax = axis + 3 * i;
    T* R = k.R + 9 * i;
    T* p = k.p + 3 * i;
    T* v = k.v + 6 * i;
    if (floating && i == 0) {
      root_pose(origins, q_all, R, p);
      for (int r = 0; r < 6; ++r) v[r] = ws.c[r] = T(0);
      add_root_motion(qd_all, v);
    } else {
      joint_pose(origins + 16 * i, ax, pr, q[i], R, p);
      from_parent(R, p, tree.parent[i], k.v, v);
      T sqd[6] = {T(0), T(0), T(0), T(0), T(0), T(0)};
      add_subspace(ax, pr, qd[i], sqd);
      add_subspace(ax, pr, qd[i], v);
      motion_cross(v, sqd, &ws.c[6 * i]);
    }
    spatial_inertia(pi + 10 * i, &ws.IA[36 * i]);
    T Iv[6];
    inertia_apply(pi + 10 * i, v, Iv);
    T* pA = &ws.pA[6 * i];
    for (int r = 0; r < 6; ++r) pA[r] = T(0);
    add_force_cross(v, Iv, pA);
  }
  for (int64_t i = n - 1; i >= 0; --i) {
    if (floating && i == 0) {
      root_acceleration(ws.IA, ws.pA, armature, gravity, tau_all, qdd_all, k, root_L);
      break;
    }
    const bool pr = tree.prismatic[i] != 0;
    const int o3 = pr ? 3 : 0;
    const T* ax = axis + 3 * i;
    T* IA = &ws.IA[36 * i];
    T* U = U_all + 6 * i;
    for (int r = 0; r < 6; ++r) {
      U[r] = IA[6 * r + o3] * ax[0] + IA[6 * r + o3 + 1] * ax[1] + IA[6 * r + o3 + 2] * ax[2];
    }
    const T D = subspace_dot(ax, pr, U) + arm[i];
    const T u = tau[i] - subspace_dot(ax, pr, &ws.pA[6 * i]);
    D_all[i] = D;
    ws.u[i] = u;
    const int64_t parent = tree.parent[i];
    if (parent < 0) continue;
    const T inv_D = T(1) / D;
    T Ia[36];
    for (int r = 0; r < 6; ++r) {
      for (int c = 0; c < 6; ++c) Ia[6 * r + c] = IA[6 * r + c] - U[r] * U[c] * inv_D;
    }
    T pa[6];
    const T* c = &ws.c[6 * i];
    for (int r = 0; r < 6; ++r) {
      T s = ws.pA[6 * i + r] + U[r] * u * inv_D;
      for (int j = 0; j < 6; ++j) s += Ia[6 * r + j] * c[j];
      pa[r] = s;
    }
    add_inertia_to_parent(k.R + 9 * i, k.p + 3 * i, Ia, &ws.IA[36 * parent]);
    add_force_to_parent(k.R + 9 * i, k.p + 3 * i, pa, &ws.pA[6 * parent]);
  }
  for (int64_t i = floating ? 1 : 0; i < n; ++i) {
    const bool pr = tree.prismatic[i] != 0;
    T* a = k.a + 6 * i;
    const int64_t parent = tree.parent[i];
    if (parent < 0) {
      const T a0[6] = {T(0), T(0), T(0), -gravity[0], -gravity[1], -gravity[2]};
      motion_to_child(k.R + 9 * i, k.p + 3 * i, a0, a);
    } else {
      motion_to_child(k.R + 9 * i, k.p + 3 * i, k.a + 6 * parent, a);
    }
    for (int r = 0; r < 6; ++r) a[r] += ws.c[6 * i + r];
    T Ua = T(0);
    for (int r = 0; r < 6; ++r) Ua += U_all[6 * i + r] * a[r];
    qdd[i] = (ws.u[i] - Ua) / D_all[i];
    add_subspace(axis + 3 * i, pr, qdd[i], a);
  }
}

// Backward of ABA for one sample from its saved row: lam = M^-1 g with the saved U and D
// (the ABA recursions without velocity and gravity; the articulated inertias enter only
// through U and D, and a free-flyer's through its saved factor root_L), then grad +=
// -d(lam . tau)/d pi at the saved kinematics, whose velocity-like propagation of lam is the
// solve's acceleration.  g and lam are nv long.
template <typename T>
void aba_backward_sample(const Tree& tree, const T* axis, const Kin<T>& k, const T* U_all,
                         const T* D_all, const T* root_L, const T* g_all, T* lam_all, T* grad,
                         T* pA, T* w) {
  const int64_t n = tree.n;
  const bool floating = tree.floating;
  const T* g = g_all + tree.vo;
  T* lam = lam_all + tree.vo;
  for (int64_t r = 0; r < 6 * n; ++r) pA[r] = T(0);
  for (int64_t i = n - 1; i >= 0; --i) {
    if (floating && i == 0) {
      for (int r = 0; r < 6; ++r) lam_all[r] = g_all[r] - pA[kRootRow[r]];
      cholesky_solve(root_L, 6, lam_all);
      break;
    }
    const bool pr = tree.prismatic[i] != 0;
    const T u = g[i] - subspace_dot(axis + 3 * i, pr, pA + 6 * i);
    lam[i] = u;  // u_i, until the forward sweep below turns it into lam_i
    const int64_t parent = tree.parent[i];
    if (parent < 0) continue;
    const T* U = U_all + 6 * i;
    const T s = u / D_all[i];
    T pa[6];
    for (int r = 0; r < 6; ++r) pa[r] = pA[6 * i + r] + U[r] * s;
    add_force_to_parent(k.R + 9 * i, k.p + 3 * i, pa, pA + 6 * parent);
  }
  for (int64_t i = 0; i < n; ++i) {
    const bool pr = tree.prismatic[i] != 0;
    T* wi = w + 6 * i;
    from_parent(k.R + 9 * i, k.p + 3 * i, tree.parent[i], w, wi);
    if (floating && i == 0) {
      add_root_motion(lam_all, wi);
    } else {
      T Uw = T(0);
      for (int r = 0; r < 6; ++r) Uw += U_all[6 * i + r] * wi[r];
      lam[i] = (lam[i] - Uw) / D_all[i];
      add_subspace(axis + 3 * i, pr, lam[i], wi);
    }
    if (grad == nullptr) continue;
    const T* v = k.v + 6 * i;
    T vxw[6];
    motion_cross(v, wi, vxw);
    add_phi(wi, k.a + 6 * i, T(-1), grad + 10 * i);
    add_phi(vxw, v, T(1), grad + 10 * i);
  }
}

// ---------------------------------------------------------------------------------------
// Composite-rigid-body algorithm
// ---------------------------------------------------------------------------------------

// CRBA saves only the poses R (9n) and p (3n) per sample.
constexpr int64_t kPoseRow = 12;

// Inertial parameters of a child body (pi, about its origin, in its frame) expressed in its
// parent, added to out: m' = m, h' = u + m p with u = R h, and
// I' = R I R^T + (2 u.p + m |p|^2) E - (p u^T + u p^T) - m p p^T (parallel axis about p).
template <typename T>
inline void add_inertial_to_parent(const T* R, const T* p, const T* pi, T* out) {
  const T m = pi[0];
  T u[3];
  for (int r = 0; r < 3; ++r) {
    u[r] = R[3 * r] * pi[1] + R[3 * r + 1] * pi[2] + R[3 * r + 2] * pi[3];
  }
  const T I[9] = {pi[4], pi[5], pi[6], pi[5], pi[7], pi[8], pi[6], pi[8], pi[9]};
  T RI[9];
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) {
      RI[3 * r + c] = R[3 * r] * I[c] + R[3 * r + 1] * I[3 + c] + R[3 * r + 2] * I[6 + c];
    }
  }
  const T diag = T(2) * (u[0] * p[0] + u[1] * p[1] + u[2] * p[2]) +
                 m * (p[0] * p[0] + p[1] * p[1] + p[2] * p[2]);
  out[0] += m;
  for (int r = 0; r < 3; ++r) out[1 + r] += u[r] + m * p[r];
  // upper triangle (r, c) in pi's order xx, xy, xz, yy, yz, zz
  constexpr int kRow[6] = {0, 0, 0, 1, 1, 2}, kCol[6] = {0, 1, 2, 1, 2, 2};
  for (int e = 0; e < 6; ++e) {
    const int r = kRow[e], c = kCol[e];
    T value = RI[3 * r] * R[3 * c] + RI[3 * r + 1] * R[3 * c + 1] + RI[3 * r + 2] * R[3 * c + 2] -
              p[r] * u[c] - u[r] * p[c] - m * p[r] * p[c];
    if (r == c) value += diag;
    out[4 + e] += value;
  }
}

// M (nv x nv, row-major) for one sample; writes the poses into R (9n) and p (3n).  Ic (10n)
// holds the composite bodies' inertial parameters, each in its own frame.  A free-flyer root
// adds M_00 = S0^T Ic_0 S0 and M_0j = S0^T (Ic_j S_j carried to the root).
template <typename T>
void crba_sample(const Tree& tree, const T* axis, const T* origins, const T* pi,
                 const T* armature, const T* q_all, T* M, T* R, T* p, T* Ic) {
  const int64_t n = tree.n, nv = tree.nv, o = tree.vo;
  const bool floating = tree.floating;
  const T* q = q_all + tree.qo;
  for (int64_t i = 0; i < n; ++i) {
    if (floating && i == 0) {
      root_pose(origins, q_all, R, p);
    } else {
      joint_pose(origins + 16 * i, axis + 3 * i, tree.prismatic[i] != 0, q[i], R + 9 * i,
                 p + 3 * i);
    }
  }
  for (int64_t r = 0; r < 10 * n; ++r) Ic[r] = pi[r];
  for (int64_t r = 0; r < nv * nv; ++r) M[r] = T(0);
  for (int64_t i = n - 1; i >= 0; --i) {
    if (floating && i == 0) {
      for (int c = 0; c < 6; ++c) {
        T S[6] = {T(0), T(0), T(0), T(0), T(0), T(0)};
        S[kRootRow[c]] = T(1);
        T F[6];
        inertia_apply(Ic, S, F);
        for (int r = 0; r < 6; ++r) M[r * nv + c] = F[kRootRow[r]];
        M[c * nv + c] += armature[c];
      }
      break;
    }
    const bool pr = tree.prismatic[i] != 0;
    const T* ax = axis + 3 * i;
    const int64_t d = o + i;
    T S[6] = {T(0), T(0), T(0), T(0), T(0), T(0)};
    add_subspace(ax, pr, T(1), S);
    T F[6];
    inertia_apply(Ic + 10 * i, S, F);
    M[d * nv + d] = subspace_dot(ax, pr, F) + armature[d];
    // Row/column i: F = Ic_i S_i carried to each ancestor j, M_ij = S_j . F.
    for (int64_t j = i; tree.parent[j] >= 0;) {
      T Fp[6] = {T(0), T(0), T(0), T(0), T(0), T(0)};
      add_force_to_parent(R + 9 * j, p + 3 * j, F, Fp);
      j = tree.parent[j];
      for (int r = 0; r < 6; ++r) F[r] = Fp[r];
      if (floating && j == 0) {
        for (int r = 0; r < 6; ++r) M[d * nv + r] = M[r * nv + d] = F[kRootRow[r]];
        break;
      }
      const T value = subspace_dot(axis + 3 * j, tree.prismatic[j] != 0, F);
      M[d * nv + o + j] = value;
      M[(o + j) * nv + d] = value;
    }
    const int64_t parent = tree.parent[i];
    if (parent >= 0) add_inertial_to_parent(R + 9 * i, p + 3 * i, Ic + 10 * i, Ic + 10 * parent);
  }
}

// Adds to grad (10) the body-frame dual of a world-frame dual gw of the inertial parameters:
// A^T gw, where pi_world = A pi is the change of frame of add_inertial_to_parent with the body's
// world pose (R, p).  With Gamma the symmetric matrix of gw's inertia part (off-diagonal
// entries halved) and u = R h: d/dI = R^T Gamma R, d/du = gw_h + 2 tr(Gamma) p - 2 Gamma p,
// d/dm = gw_m + gw_h . p + |p|^2 tr(Gamma) - p^T Gamma p.
template <typename T>
inline void add_inertial_dual_to_body(const T* R, const T* p, const T* gw, T* grad) {
  const T half = T(0.5);
  const T Gm[9] = {gw[4], half * gw[5], half * gw[6],
                   half * gw[5], gw[7], half * gw[8],
                   half * gw[6], half * gw[8], gw[9]};
  const T trace = Gm[0] + Gm[4] + Gm[8];
  T Gp[3];
  for (int r = 0; r < 3; ++r) {
    Gp[r] = Gm[3 * r] * p[0] + Gm[3 * r + 1] * p[1] + Gm[3 * r + 2] * p[2];
  }
  const T pp = p[0] * p[0] + p[1] * p[1] + p[2] * p[2];
  grad[0] += gw[0] + gw[1] * p[0] + gw[2] * p[1] + gw[3] * p[2] + pp * trace -
             (p[0] * Gp[0] + p[1] * Gp[1] + p[2] * Gp[2]);
  T du[3];
  for (int r = 0; r < 3; ++r) du[r] = gw[1 + r] + T(2) * (trace * p[r] - Gp[r]);
  for (int c = 0; c < 3; ++c) grad[1 + c] += R[c] * du[0] + R[3 + c] * du[1] + R[6 + c] * du[2];
  // R^T Gamma R, upper triangle; off-diagonal entries count twice in pi's order.
  T GR[9];
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) {
      GR[3 * r + c] = Gm[3 * r] * R[c] + Gm[3 * r + 1] * R[3 + c] + Gm[3 * r + 2] * R[6 + c];
    }
  }
  constexpr int kRow[6] = {0, 0, 0, 1, 1, 2}, kCol[6] = {0, 1, 2, 1, 2, 2};
  for (int e = 0; e < 6; ++e) {
    const int r = kRow[e], c = kCol[e];
    const T value = R[r] * GR[c] + R[3 + r] * GR[3 + c] + R[6 + r] * GR[6 + c];
    grad[4 + e] += r == c ? value : T(2) * value;
  }
}

// Adds d<G, M>/d pi to grad (n, 10).  M = sum_k J_k^T I(pi_k) J_k with J_k's columns the
// motion subspaces of k and its ancestors; in world coordinates (S_i) they are the same for
// every body, so the world-frame dual of body k is
// gw_k = sum_ij G_ij phi(S_i, S_j) over its ancestors i, j (incl. k), which adds one term to
// its parent's: gw_k = gw_parent + phi(S_k, G_kk S_k + sum_j (G_kj + G_jk) S_j) over the
// proper ancestors j (phi is symmetric).  A free-flyer root has six columns S0_a (G is
// nv x nv): gw_0 = sum_a phi(S0_a, sum_b G_ab S0_b).  Each dual is then carried to the body
// frame.  ws (28 n + 36): world poses Rw (9n), pw (3n), subspaces S (6n), duals gw (10n),
// the root's columns (36).
template <typename T>
void crba_inertial_adjoint_sample(const Tree& tree, const T* axis, const T* R, const T* p,
                                  const T* G, T* grad, T* ws) {
  const int64_t n = tree.n, nv = tree.nv, o = tree.vo;
  const bool floating = tree.floating;
  T* Rw = ws;
  T* pw = ws + 9 * n;
  T* S = ws + 12 * n;
  T* gw = ws + 18 * n;
  T* S0 = ws + 28 * n;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t parent = tree.parent[k];
    T* Rk = Rw + 9 * k;
    T* pk = pw + 3 * k;
    if (parent < 0) {
      for (int r = 0; r < 9; ++r) Rk[r] = R[9 * k + r];
      for (int r = 0; r < 3; ++r) pk[r] = p[3 * k + r];
    } else {
      const T* Rp = Rw + 9 * parent;
      const T* pp = pw + 3 * parent;
      const T* Rl = R + 9 * k;
      const T* pl = p + 3 * k;
      for (int r = 0; r < 3; ++r) {
        for (int c = 0; c < 3; ++c) {
          Rk[3 * r + c] =
              Rp[3 * r] * Rl[c] + Rp[3 * r + 1] * Rl[3 + c] + Rp[3 * r + 2] * Rl[6 + c];
        }
        pk[r] = Rp[3 * r] * pl[0] + Rp[3 * r + 1] * pl[1] + Rp[3 * r + 2] * pl[2] + pp[r];
      }
    }
    T* gk = gw + 10 * k;
    for (int r = 0; r < 10; ++r) gk[r] = parent < 0 ? T(0) : gw[10 * parent + r];
    if (floating && k == 0) {
      // columns in v order: linear [0; e_c], angular [e_c; p x e_c], e_c = column c of Rw
      for (int c = 0; c < 3; ++c) {
        T* lin = S0 + 6 * c;
        T* ang = S0 + 6 * (3 + c);
        for (int r = 0; r < 3; ++r) {
          lin[r] = T(0);
          lin[3 + r] = ang[r] = Rk[3 * r + c];
        }
        cross(pk, ang, ang + 3);
      }
      for (int a = 0; a < 6; ++a) {
        T w[6] = {T(0), T(0), T(0), T(0), T(0), T(0)};
        for (int b = 0; b < 6; ++b) {
          for (int r = 0; r < 6; ++r) w[r] += G[a * nv + b] * S0[6 * b + r];
        }
        add_phi(S0 + 6 * a, w, T(1), gk);
      }
      add_inertial_dual_to_body(Rk, pk, gk, grad);
      continue;
    }
    // S_k in world coordinates about the world origin: [e; pw x e] or [0; e], e = Rw axis.
    const T* ax = axis + 3 * k;
    T e[3];
    for (int r = 0; r < 3; ++r) {
      e[r] = Rk[3 * r] * ax[0] + Rk[3 * r + 1] * ax[1] + Rk[3 * r + 2] * ax[2];
    }
    T* Sk = S + 6 * k;
    if (tree.prismatic[k] != 0) {
      for (int r = 0; r < 3; ++r) {
        Sk[r] = T(0);
        Sk[3 + r] = e[r];
      }
    } else {
      for (int r = 0; r < 3; ++r) Sk[r] = e[r];
      cross(pk, e, Sk + 3);
    }
    const int64_t d = o + k;
    const T gkk = G[d * nv + d];
    T w[6];
    for (int r = 0; r < 6; ++r) w[r] = gkk * Sk[r];
    for (int64_t j = parent; j >= 0; j = tree.parent[j]) {
      if (floating && j == 0) {
        for (int a = 0; a < 6; ++a) {
          const T gka = G[d * nv + a] + G[a * nv + d];
          for (int r = 0; r < 6; ++r) w[r] += gka * S0[6 * a + r];
        }
        break;
      }
      const T gkj = G[d * nv + o + j] + G[(o + j) * nv + d];
      for (int r = 0; r < 6; ++r) w[r] += gkj * S[6 * j + r];
    }
    add_phi(Sk, w, T(1), gk);
    add_inertial_dual_to_body(Rk, pk, gk, grad + 10 * k);
  }
}

// ---------------------------------------------------------------------------------------
// Batch drivers
// ---------------------------------------------------------------------------------------

// Threads: a call splits over threads only where each thread gets at least
// kMinWorkPerThread joint-samples (batch x joints; a few hundred microseconds of RNEA or ABA),
// and over at most torch.get_num_threads() of them.  Below that, the fork/join and, on a busy
// machine, the wait for a descheduled thread cost more than the split saves (2-thread calls
// measured 10-35x slower under load where 1-thread calls held).  A split call has
// kChunksPerThread chunks of samples per thread (the chunks also hold the partial sums of
// shared parameter gradients).
struct Split {
  int64_t chunks;
  int64_t threads;
};

Split split_for(int64_t batch, int64_t work) {
  if (at::in_parallel_region()) return {1, 1};
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), work / kMinWorkPerThread);
  if (threads <= 1) return {1, 1};
  const int64_t by_size = std::max<int64_t>(1, batch / kMinSamplesPerChunk);
  const int64_t chunks =
      std::max<int64_t>(1, std::min<int64_t>(threads * kChunksPerThread, by_size));
  return {chunks, std::min<int64_t>(threads, chunks)};
}

// Threads a call of `batch` samples of a `joints`-joint tree runs on (the rule above).
int64_t threads_for(int64_t batch, int64_t joints) {
  return split_for(batch, batch * joints).threads;
}

// Runs body(chunk, first, end) over contiguous sample ranges on split.threads threads; chunk
// indices address per-chunk partial sums.  The calling thread works too, and every thread
// takes the next chunk from a shared counter, so a thread the scheduler takes away delays
// the call by at most the chunk it holds.  The helpers are plain threads started per call
// (tens of microseconds, against the hundreds of microseconds of work split_for asks for)
// that exit when the chunks run out: unlike an OpenMP team, nothing spins between calls,
// which on a busy machine took the cores from the serial work around the kernels (2-thread
// calls measured 10-35x slower under load, 1-thread calls held).
template <typename F>
void for_chunks(int64_t batch, const Split& split, const F& body) {
  const int64_t chunks = split.chunks, threads = split.threads;
  if (threads <= 1) {
    for (int64_t c = 0; c < chunks; ++c) body(c, batch * c / chunks, batch * (c + 1) / chunks);
    return;
  }
  std::atomic<int64_t> next{0};
  const auto work = [&]() {
    for (int64_t c = next++; c < chunks; c = next++) {
      body(c, batch * c / chunks, batch * (c + 1) / chunks);
    }
  };
  std::vector<std::thread> helpers;
  helpers.reserve(threads - 1);
  for (int64_t t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (auto& helper : helpers) helper.join();
}

Tree make_tree(const torch::Tensor& parent, const torch::Tensor& prismatic) {
  TORCH_CHECK(parent.scalar_type() == torch::kInt64 && prismatic.scalar_type() == torch::kInt64,
              "tree index tensors must be int64");
  const int64_t n = parent.numel();
  const int64_t* type = prismatic.data_ptr<int64_t>();
  const bool floating = n > 0 && type[0] == kFreeFlyer;
  for (int64_t i = 1; i < n; ++i) {
    TORCH_CHECK(type[i] != kFreeFlyer, "only joint 0 may be a free-flyer");
  }
  const int64_t qo = floating ? 6 : 0, vo = floating ? 5 : 0;
  return Tree{n, parent.data_ptr<int64_t>(), type, floating, n + qo, n + vo, qo, vo};
}

// Number of samples of a contiguous (..., n) state.
int64_t batch_of(const torch::Tensor& x, int64_t n, const char* name) {
  TORCH_CHECK(x.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(n > 0 && x.dim() >= 1 && x.size(-1) == n, name, " must have shape (..., ", n, ")");
  return x.numel() / n;
}

void check_state(const torch::Tensor& x, int64_t batch, int64_t n, const char* name) {
  TORCH_CHECK(batch_of(x, n, name) == batch, name, " does not match the batch of q");
}

// A (B, row) tensor for saved rows, or an undefined one when nothing is saved.
torch::Tensor saved_rows(const torch::Tensor& q, int64_t batch, int64_t row, bool save) {
  // undefined (None in Python) when nothing is saved: an allocation costs about 1 us, a
  // sizeable part of a call at B = 1
  return save ? torch::empty({batch, row}, q.options()) : torch::Tensor();
}

void check_saved(const torch::Tensor& saved, int64_t batch, int64_t row) {
  TORCH_CHECK(saved.dim() == 2 && saved.size(0) == batch && saved.size(1) == row,
              "saved rows do not match the batch");
}

// Gradient of a parameter given like `like` (one shared row or one row per sample), in its
// shape: per-sample rows are written in place, a shared one is summed over the batch from
// per-chunk partial rows (written directly when there is one chunk).
template <typename T>
struct GradOut {
  torch::Tensor out, partial;
  T* base = nullptr;
  int64_t row = 0;
  bool per_sample = false, active = false;

  GradOut(bool wanted, const torch::Tensor& like, int64_t batch, int64_t chunks,
          int64_t row_size) {
    if (!wanted) return;
    active = true;
    row = row_size;
    out = torch::zeros(like.sizes(), like.options());
    per_sample = like.numel() != row;
    if (per_sample || chunks == 1) {
      base = out.data_ptr<T>();
    } else {
      partial = torch::zeros({chunks, row}, like.options());
      base = partial.data_ptr<T>();
    }
  }
  // Row to accumulate sample b (in chunk c) into.
  T* at(int64_t c, int64_t b) const {
    return per_sample ? base + b * row : partial.defined() ? base + c * row : base;
  }
  torch::Tensor finish() {
    if (!active) return torch::Tensor();
    if (partial.defined()) {
      T* dst = out.data_ptr<T>();
      for (int64_t c = 0; c < partial.size(0); ++c) {
        for (int64_t r = 0; r < row; ++r) dst[r] += base[c * row + r];
      }
    }
    return out;
  }
};

// Inputs: q (..., nq), qd, x (..., nv) contiguous, all of the same batch B (nq = nv = n on a
// fixed base, see Tree); inertial (n, 10) values or (B, n, 10); armature nv or (B, nv);
// origins (n, 4, 4) or (B, n, 4, 4); gravity 3 or (B, 3); axis (n, 3); parent, prismatic
// (n,) int64 (prismatic[0] == kFreeFlyer for a floating base).  Returns (tau like qd, saved):
// saved is (B, kRneaRow * n) when save (kinematics and transmitted forces), else undefined.
std::vector<torch::Tensor> rnea_forward(torch::Tensor q, torch::Tensor qd, torch::Tensor qdd,
                                        torch::Tensor inertial, torch::Tensor armature,
                                        torch::Tensor origins, torch::Tensor gravity,
                                        torch::Tensor axis, torch::Tensor parent,
                                        torch::Tensor prismatic, bool save) {
  const Tree tree = make_tree(parent, prismatic);
  const int64_t n = tree.n, nq = tree.nq, nv = tree.nv;
  const int64_t batch = batch_of(q, nq, "q");
  check_state(qd, batch, nv, "qd");
  check_state(qdd, batch, nv, "qdd");
  auto tau = torch::empty_like(qd);
  auto saved = saved_rows(q, batch, kRneaRow * n, save);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "rnea_forward", [&] {
    using T = scalar_t;
    const auto pi = param<T>(inertial, batch, 10 * n, "inertial");
    const auto arm = param<T>(armature, batch, nv, "armature");
    const auto org = param<T>(origins, batch, 16 * n, "origins");
    const auto grav = param<T>(gravity, batch, 3, "gravity");
    const T *qp = q.data_ptr<T>(), *qdp = qd.data_ptr<T>(), *qddp = qdd.data_ptr<T>();
    const T* ax = axis.data_ptr<T>();
    T* out = tau.data_ptr<T>();
    T* rows = save ? saved.data_ptr<T>() : nullptr;
    for_chunks(batch, split_for(batch, batch * n), [&](int64_t, int64_t b0, int64_t b1) {
      Scratch<T> ws(n, kKinRow);
      for (int64_t b = b0; b < b1; ++b) {
        T* row = save ? rows + b * kRneaRow * n : ws.row();
        const Kin<T> k(row, n);
        rnea_sample(tree, ax, org.at(b), pi.at(b), arm.at(b), grav.at(b), qp + b * nq,
                    qdp + b * nv, qddp + b * nv, out + b * nv, k,
                    save ? row + kKinRow * n : ws.f());
      }
    });
  });
  return {tau, saved};
}

// Backward of RNEA from the rows rnea_forward saved, for the upstream gradient g (like qd):
// (d(g . tau)/d q, d/d qd, M g = d/d qdd, d/d inertial, d/d armature), each undefined unless
// asked for, each parameter gradient in the parameter's shape (summed over the batch when
// shared).  q: the configurations (a free-flyer's quaternion adjoint reads them).
std::vector<torch::Tensor> rnea_backward(torch::Tensor saved, torch::Tensor g, torch::Tensor q,
                                         torch::Tensor qd, torch::Tensor qdd,
                                         torch::Tensor inertial, torch::Tensor armature,
                                         torch::Tensor axis, torch::Tensor parent,
                                         torch::Tensor prismatic, bool need_q, bool need_qd,
                                         bool need_qdd, bool need_pi, bool need_armature) {
  const Tree tree = make_tree(parent, prismatic);
  const int64_t n = tree.n, nq = tree.nq, nv = tree.nv;
  const int64_t batch = batch_of(g, nv, "grad");
  check_state(q, batch, nq, "q");
  check_state(qd, batch, nv, "qd");
  check_state(qdd, batch, nv, "qdd");
  check_saved(saved, batch, kRneaRow * n);
  const Split split = split_for(batch, batch * n);
  const int64_t chunks = split.chunks;
  auto grad_q = need_q ? torch::zeros_like(q) : torch::Tensor();
  auto grad_qd = need_qd ? torch::zeros_like(g) : torch::Tensor();
  auto grad_qdd = need_qdd ? torch::empty_like(g) : torch::Tensor();
  std::vector<torch::Tensor> result;
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "rnea_backward", [&] {
    using T = scalar_t;
    const auto pi = param<T>(inertial, batch, 10 * n, "inertial");
    const auto arm = param<T>(armature, batch, nv, "armature");
    GradOut<T> gpi(need_pi, inertial, batch, chunks, 10 * n);
    GradOut<T> garm(need_armature, armature, batch, chunks, nv);
    T* rows = saved.data_ptr<T>();
    const T *gp = g.data_ptr<T>(), *qp = q.data_ptr<T>();
    const T *qdp = qd.data_ptr<T>(), *qddp = qdd.data_ptr<T>();
    const T* ax = axis.data_ptr<T>();
    T* gq = need_q ? grad_q.data_ptr<T>() : nullptr;
    T* gqd = need_qd ? grad_qd.data_ptr<T>() : nullptr;
    T* mg = need_qdd ? grad_qdd.data_ptr<T>() : nullptr;
    const bool adjoint = need_q || need_qd || need_qdd || need_pi;
    for_chunks(batch, split, [&](int64_t c, int64_t b0, int64_t b1) {
      std::vector<T> ws(kAdjointWork * n);
      for (int64_t b = b0; b < b1; ++b) {
        const T* gb = gp + b * nv;
        if (adjoint) {
          T* row = rows + b * kRneaRow * n;
          const Kin<T> k(row, n);
          rnea_adjoint_sample(tree, ax, k, row + kKinRow * n, pi.at(b), arm.at(b), qp + b * nq,
                              qdp + b * nv, qddp + b * nv, gb, T(1),
                              gq ? gq + b * nq : nullptr, gqd ? gqd + b * nv : nullptr,
                              mg ? mg + b * nv : nullptr, gpi.active ? gpi.at(c, b) : nullptr,
                              ws.data());
        }
        if (garm.active) {
          T* ga = garm.at(c, b);
          for (int64_t i = 0; i < nv; ++i) ga[i] += gb[i] * qddp[b * nv + i];
        }
      }
    });
    result = {grad_q, grad_qd, grad_qdd, gpi.finish(), garm.finish()};
  });
  return result;
}

// Returns (qdd like qd, saved): saved is (B, aba_row) when save (kinematics, U, D and a
// free-flyer's factor).
std::vector<torch::Tensor> aba_forward(torch::Tensor q, torch::Tensor qd, torch::Tensor tau,
                                       torch::Tensor inertial, torch::Tensor armature,
                                       torch::Tensor origins, torch::Tensor gravity,
                                       torch::Tensor axis, torch::Tensor parent,
                                       torch::Tensor prismatic, bool save) {
  const Tree tree = make_tree(parent, prismatic);
  const int64_t n = tree.n, nq = tree.nq, nv = tree.nv, row_size = aba_row(tree);
  const int64_t batch = batch_of(q, nq, "q");
  check_state(qd, batch, nv, "qd");
  check_state(tau, batch, nv, "tau");
  auto qdd = torch::empty_like(qd);
  auto saved = saved_rows(q, batch, row_size, save);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "aba_forward", [&] {
    using T = scalar_t;
    const auto pi = param<T>(inertial, batch, 10 * n, "inertial");
    const auto arm = param<T>(armature, batch, nv, "armature");
    const auto org = param<T>(origins, batch, 16 * n, "origins");
    const auto grav = param<T>(gravity, batch, 3, "gravity");
    const T *qp = q.data_ptr<T>(), *qdp = qd.data_ptr<T>(), *taup = tau.data_ptr<T>();
    const T* ax = axis.data_ptr<T>();
    T* out = qdd.data_ptr<T>();
    T* rows = save ? saved.data_ptr<T>() : nullptr;
    for_chunks(batch, split_for(batch, batch * n), [&](int64_t, int64_t b0, int64_t b1) {
      AbaScratch<T> ws(tree);
      for (int64_t b = b0; b < b1; ++b) {
        T* row = save ? rows + b * row_size : ws.row();
        const Kin<T> k(row, n);
        aba_sample(tree, ax, org.at(b), pi.at(b), arm.at(b), grav.at(b), qp + b * nq,
                   qdp + b * nv, taup + b * nv, out + b * nv, k, row + kKinRow * n,
                   row + (kKinRow + 6) * n, row + kAbaRow * n, ws);
      }
    });
  });
  return {qdd, saved};
}

// Backward of ABA from the rows aba_forward saved: with lam = M^-1 g and M qdd + h = tau,
// (d(g . qdd)/d q = -lam . d rnea/d q, the same for qd, lam = d/d tau, -d(lam . tau)/d inertial,
// -lam * qdd for the armature), each undefined unless asked for (lam is always solved), the
// parameter gradients in the parameters' shapes (summed over the batch when shared).  The
// state gradients are one RNEA adjoint of lam at the saved kinematics (whose accelerations
// are the solution qdd).
std::vector<torch::Tensor> aba_backward(torch::Tensor saved, torch::Tensor g, torch::Tensor q,
                                        torch::Tensor qd, torch::Tensor qdd,
                                        torch::Tensor inertial, torch::Tensor armature,
                                        torch::Tensor axis, torch::Tensor parent,
                                        torch::Tensor prismatic, bool need_q, bool need_qd,
                                        bool need_tau, bool need_pi, bool need_armature) {
  const Tree tree = make_tree(parent, prismatic);
  const int64_t n = tree.n, nq = tree.nq, nv = tree.nv, row_size = aba_row(tree);
  const int64_t batch = batch_of(g, nv, "grad");
  check_state(q, batch, nq, "q");
  check_state(qd, batch, nv, "qd");
  check_state(qdd, batch, nv, "qdd");
  check_saved(saved, batch, row_size);
  const Split split = split_for(batch, batch * n);
  const int64_t chunks = split.chunks;
  auto lam = torch::empty_like(g);
  auto grad_q = need_q ? torch::zeros_like(q) : torch::Tensor();
  auto grad_qd = need_qd ? torch::zeros_like(g) : torch::Tensor();
  std::vector<torch::Tensor> result;
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "aba_backward", [&] {
    using T = scalar_t;
    const auto pi = param<T>(inertial, batch, 10 * n, "inertial");
    const auto arm = param<T>(armature, batch, nv, "armature");
    GradOut<T> gpi(need_pi, inertial, batch, chunks, 10 * n);
    GradOut<T> garm(need_armature, armature, batch, chunks, nv);
    T* rows = saved.data_ptr<T>();
    const T *gp = g.data_ptr<T>(), *qp = q.data_ptr<T>();
    const T *qdp = qd.data_ptr<T>(), *qddp = qdd.data_ptr<T>();
    const T* ax = axis.data_ptr<T>();
    T* lp = lam.data_ptr<T>();
    T* gq = need_q ? grad_q.data_ptr<T>() : nullptr;
    T* gqd = need_qd ? grad_qd.data_ptr<T>() : nullptr;
    for_chunks(batch, split, [&](int64_t c, int64_t b0, int64_t b1) {
      std::vector<T> pA(6 * n), w(6 * n), ws(need_q || need_qd ? kAdjointWork * n : 0);
      for (int64_t b = b0; b < b1; ++b) {
        T* row = rows + b * row_size;
        const Kin<T> k(row, n);
        aba_backward_sample(tree, ax, k, row + kKinRow * n, row + (kKinRow + 6) * n,
                            row + kAbaRow * n, gp + b * nv, lp + b * nv,
                            gpi.active ? gpi.at(c, b) : nullptr, pA.data(), w.data());
        if (need_q || need_qd) {
          rnea_adjoint_sample(tree, ax, k, static_cast<const T*>(nullptr), pi.at(b), arm.at(b),
                              qp + b * nq, qdp + b * nv, qddp + b * nv, lp + b * nv, T(-1),
                              gq ? gq + b * nq : nullptr, gqd ? gqd + b * nv : nullptr,
                              static_cast<T*>(nullptr), static_cast<T*>(nullptr), ws.data());
        }
        if (garm.active) {
          T* ga = garm.at(c, b);
          for (int64_t i = 0; i < nv; ++i) ga[i] -= lp[b * nv + i] * qddp[b * nv + i];
        }
      }
    });
    result = {grad_q, grad_qd, need_tau ? lam : torch::Tensor(), gpi.finish(), garm.finish()};
  });
  return result;
}

// Sizes of a (..., nv) state with `extra` trailing dims appended.
std::vector<int64_t> with_dims(const torch::Tensor& x, std::initializer_list<int64_t> extra) {
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.insert(sizes.end(), extra);
  return sizes;
}

// Jacobians of RNEA without autograd (Pinocchio's computeRNEADerivatives): returns (tau like
// qd, dtau/dq (..., nv, nq), dtau/dqd, M = dtau/dqdd (..., nv, nv), Y = dtau/d inertial
// (..., nv, 10 n) when `regressor`, else undefined).  Row j of every Jacobian is one adjoint
// sweep of the unit vector e_j at the sample's saved kinematics and forces
// (rnea_adjoint_sample; M e_j is the column, M is symmetric): nv sweeps of O(n) each.  A
// free-flyer's dtau/dq is w.r.t. the coordinates of q (quaternion entries included).
std::vector<torch::Tensor> rnea_derivatives(torch::Tensor q, torch::Tensor qd,
                                            torch::Tensor qdd, torch::Tensor inertial,
                                            torch::Tensor armature, torch::Tensor origins,
                                            torch::Tensor gravity, torch::Tensor axis,
                                            torch::Tensor parent, torch::Tensor prismatic,
                                            bool regressor) {
  const Tree tree = make_tree(parent, prismatic);
  const int64_t n = tree.n, nq = tree.nq, nv = tree.nv;
  const int64_t batch = batch_of(q, nq, "q");
  check_state(qd, batch, nv, "qd");
  check_state(qdd, batch, nv, "qdd");
  auto tau = torch::empty_like(qd);
  auto dq = torch::zeros(with_dims(qd, {nq}), q.options());
  auto dqd = torch::zeros(with_dims(qd, {nv}), q.options());
  auto M = torch::empty(with_dims(qd, {nv}), q.options());
  auto Y = regressor ? torch::zeros(with_dims(qd, {10 * n}), q.options()) : torch::Tensor();
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "rnea_derivatives", [&] {
    using T = scalar_t;
    const auto pi = param<T>(inertial, batch, 10 * n, "inertial");
    const auto arm = param<T>(armature, batch, nv, "armature");
    const auto org = param<T>(origins, batch, 16 * n, "origins");
    const auto grav = param<T>(gravity, batch, 3, "gravity");
    const T *qp = q.data_ptr<T>(), *qdp = qd.data_ptr<T>(), *qddp = qdd.data_ptr<T>();
    const T* ax = axis.data_ptr<T>();
    T *taup = tau.data_ptr<T>(), *dqp = dq.data_ptr<T>(), *dqdp = dqd.data_ptr<T>();
    T *Mp = M.data_ptr<T>(), *Yp = regressor ? Y.data_ptr<T>() : nullptr;
    for_chunks(batch, split_for(batch, batch * nv * n), [&](int64_t, int64_t b0, int64_t b1) {
      std::vector<T> row(kRneaRow * n), ws(kAdjointWork * n), e(nv, T(0));
      const Kin<T> k(row.data(), n);
      const T* F = row.data() + kKinRow * n;
      for (int64_t b = b0; b < b1; ++b) {
        const T *qb = qp + b * nq, *qdb = qdp + b * nv, *qddb = qddp + b * nv;
        rnea_sample(tree, ax, org.at(b), pi.at(b), arm.at(b), grav.at(b), qb, qdb, qddb,
                    taup + b * nv, k, row.data() + kKinRow * n);
        for (int64_t j = 0; j < nv; ++j) {
          const int64_t r = b * nv + j;
          e[j] = T(1);
          rnea_adjoint_sample(tree, ax, k, F, pi.at(b), arm.at(b), qb, qdb, qddb, e.data(),
                              T(1), dqp + r * nq, dqdp + r * nv, Mp + r * nv,
                              Yp ? Yp + 10 * n * r : nullptr, ws.data(), tree.body_of(j));
          e[j] = T(0);
        }
      }
    });
  });
  return {tau, dq, dqd, M, Y};
}

// Jacobians of ABA without autograd (Pinocchio's computeABADerivatives): returns (qdd like qd,
// dqdd/dq (..., nv, nq), dqdd/dqd, M^-1 = dqdd/dtau (..., nv, nv)).  With M qdd + h = tau,
// row j of dqdd/dx is -lam_j^T dtau/dx at qdd with lam_j = M^-1 e_j (row j of M^-1, solved
// from the saved U and D like aba_backward): one solve and one RNEA adjoint sweep of -lam_j
// per row.
std::vector<torch::Tensor> aba_derivatives(torch::Tensor q, torch::Tensor qd, torch::Tensor tau,
                                           torch::Tensor inertial, torch::Tensor armature,
                                           torch::Tensor origins, torch::Tensor gravity,
                                           torch::Tensor axis, torch::Tensor parent,
                                           torch::Tensor prismatic) {
  const Tree tree = make_tree(parent, prismatic);
  const int64_t n = tree.n, nq = tree.nq, nv = tree.nv;
  const int64_t batch = batch_of(q, nq, "q");
  check_state(qd, batch, nv, "qd");
  check_state(tau, batch, nv, "tau");
  auto qdd = torch::empty_like(qd);
  auto dq = torch::zeros(with_dims(qd, {nq}), q.options());
  auto dqd = torch::zeros(with_dims(qd, {nv}), q.options());
  auto Minv = torch::empty(with_dims(qd, {nv}), q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "aba_derivatives", [&] {
    using T = scalar_t;
    const auto pi = param<T>(inertial, batch, 10 * n, "inertial");
    const auto arm = param<T>(armature, batch, nv, "armature");
    const auto org = param<T>(origins, batch, 16 * n, "origins");
    const auto grav = param<T>(gravity, batch, 3, "gravity");
    const T *qp = q.data_ptr<T>(), *qdp = qd.data_ptr<T>(), *taup = tau.data_ptr<T>();
    const T* ax = axis.data_ptr<T>();
    T *qddp = qdd.data_ptr<T>(), *dqp = dq.data_ptr<T>(), *dqdp = dqd.data_ptr<T>();
    T* Mip = Minv.data_ptr<T>();
    for_chunks(batch, split_for(batch, batch * nv * n), [&](int64_t, int64_t b0, int64_t b1) {
      AbaScratch<T> aba_ws(tree);
      std::vector<T> F(6 * n), ws(kAdjointWork * n), e(nv, T(0)), pA(6 * n), w(6 * n);
      T* row = aba_ws.row();
      const Kin<T> k(row, n);
      T* U = row + kKinRow * n;
      T* D = row + (kKinRow + 6) * n;
      T* L = row + kAbaRow * n;
      for (int64_t b = b0; b < b1; ++b) {
        const T *qb = qp + b * nq, *qdb = qdp + b * nv;
        T* qddb = qddp + b * nv;
        aba_sample(tree, ax, org.at(b), pi.at(b), arm.at(b), grav.at(b), qb, qdb,
                   taup + b * nv, qddb, k, U, D, L, aba_ws);
        transmitted_forces(tree, pi.at(b), k, F.data());
        for (int64_t j = 0; j < nv; ++j) {
          const int64_t r = b * nv + j;
          e[j] = T(1);
          aba_backward_sample(tree, ax, k, static_cast<const T*>(U), static_cast<const T*>(D),
                              static_cast<const T*>(L), static_cast<const T*>(e.data()),
                              Mip + r * nv, static_cast<T*>(nullptr), pA.data(), w.data());
          e[j] = T(0);
          rnea_adjoint_sample(tree, ax, k, static_cast<const T*>(F.data()), pi.at(b),
                              arm.at(b), qb, qdb, static_cast<const T*>(qddb),
                              static_cast<const T*>(Mip + r * nv), T(-1), dqp + r * nq,
                              dqdp + r * nv, static_cast<T*>(nullptr), static_cast<T*>(nullptr),
                              ws.data());
        }
      }
    });
  });
  return {qdd, dq, dqd, Minv};
}

// A model's parameters as the kernels read them, bound once per model (native.py keeps one
// per model): a call at B = 1 then converts three tensors instead of ten, and the checks
// that decide whether a call is the common one (dtype, CPU, contiguous, equal batch shapes, no
// gradient asked for, joint origins unchanged since binding) run here, in nanoseconds,
// instead of in Python.  Every method returns None when the call is not the common one; the
// caller then takes its general path, which checks and reports everything.
struct BoundModel {
  torch::Tensor inertial, armature, origins, gravity, axis, parent, prismatic;
  torch::Tensor origin_xyz, origin_rpy;
  int64_t xyz_version, rpy_version, nq, nv;
  c10::ScalarType dtype;

  BoundModel(torch::Tensor inertial, torch::Tensor armature, torch::Tensor origins,
             torch::Tensor gravity, torch::Tensor axis, torch::Tensor parent,
             torch::Tensor prismatic, torch::Tensor origin_xyz, torch::Tensor origin_rpy)
      : inertial(inertial), armature(armature), origins(origins), gravity(gravity),
        axis(axis), parent(parent), prismatic(prismatic), origin_xyz(origin_xyz),
        origin_rpy(origin_rpy), xyz_version(origin_xyz._version()),
        rpy_version(origin_rpy._version()), dtype(inertial.scalar_type()) {
    const Tree tree = make_tree(parent, prismatic);
    nq = tree.nq;
    nv = tree.nv;
  }

  bool state_ok(const torch::Tensor& x, int64_t size) const {
    return x.scalar_type() == dtype && x.device().is_cpu() && x.dim() >= 1 &&
           x.size(-1) == size && x.is_contiguous();
  }

  // The common call: q, qd, x of one batch shape; with `gradients`, nothing asks for a
  // gradient.
  bool common(const torch::Tensor& q, const torch::Tensor& qd, const torch::Tensor& x,
              bool gradients) const {
    if (!state_ok(q, nq) || !state_ok(qd, nv) || !state_ok(x, nv) ||
        !x.sizes().equals(qd.sizes()) || q.dim() != qd.dim() ||
        !q.sizes().slice(0, q.dim() - 1).equals(qd.sizes().slice(0, qd.dim() - 1))) {
      return false;
    }
    if (origin_xyz._version() != xyz_version || origin_rpy._version() != rpy_version) {
      return false;   // the bound joint origins are stale: the caller binds again
    }
    if (gradients && at::GradMode::is_enabled()) {
      for (const auto* t : {&q, &qd, &x, &inertial, &armature, &origin_xyz, &origin_rpy,
                            &gravity}) {
        if (t->requires_grad()) return false;
      }
    }
    return true;
  }

  py::object rnea(const torch::Tensor& q, const torch::Tensor& qd, const torch::Tensor& qdd) {
    if (!common(q, qd, qdd, true)) return py::none();
    return py::cast(rnea_forward(q, qd, qdd, inertial, armature, origins, gravity, axis, parent,
                                 prismatic, false)[0]);
  }

  py::object aba(const torch::Tensor& q, const torch::Tensor& qd, const torch::Tensor& tau) {
    if (!common(q, qd, tau, true)) return py::none();
    return py::cast(aba_forward(q, qd, tau, inertial, armature, origins, gravity, axis, parent,
                                prismatic, false)[0]);
  }

  py::object rnea_jacobians(const torch::Tensor& q, const torch::Tensor& qd,
                            const torch::Tensor& qdd, bool regressor) {
    if (!common(q, qd, qdd, false)) return py::none();
    auto out = rnea_derivatives(q, qd, qdd, inertial, armature, origins, gravity, axis, parent,
                                prismatic, regressor);
    if (!regressor) return py::make_tuple(out[0], out[1], out[2], out[3]);
    return py::make_tuple(out[0], out[1], out[2], out[3], out[4]);
  }

  py::object aba_jacobians(const torch::Tensor& q, const torch::Tensor& qd,
                           const torch::Tensor& tau) {
    if (!common(q, qd, tau, false)) return py::none();
    auto out = aba_derivatives(q, qd, tau, inertial, armature, origins, gravity, axis, parent,
                               prismatic);
    return py::make_tuple(out[0], out[1], out[2], out[3]);
  }
};

// Returns (M (..., nv, nv) for q (..., nq), saved): saved is (B, kPoseRow * n) when save.
std::vector<torch::Tensor> crba_forward(torch::Tensor q, torch::Tensor inertial,
                                        torch::Tensor armature, torch::Tensor origins,
                                        torch::Tensor axis, torch::Tensor parent,
                                        torch::Tensor prismatic, bool save) {
  const Tree tree = make_tree(parent, prismatic);
  const int64_t n = tree.n, nq = tree.nq, nv = tree.nv;
  const int64_t batch = batch_of(q, nq, "q");
  std::vector<int64_t> sizes(q.sizes().begin(), q.sizes().end());
  sizes.back() = nv;
  sizes.push_back(nv);
  auto M = torch::empty(sizes, q.options());
  auto saved = saved_rows(q, batch, kPoseRow * n, save);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "crba_forward", [&] {
    using T = scalar_t;
    const auto pi = param<T>(inertial, batch, 10 * n, "inertial");
    const auto arm = param<T>(armature, batch, nv, "armature");
    const auto org = param<T>(origins, batch, 16 * n, "origins");
    const T* qp = q.data_ptr<T>();
    const T* ax = axis.data_ptr<T>();
    T* out = M.data_ptr<T>();
    T* rows = save ? saved.data_ptr<T>() : nullptr;
    for_chunks(batch, split_for(batch, batch * n), [&](int64_t, int64_t b0, int64_t b1) {
      std::vector<T> row(kPoseRow * n), Ic(10 * n);
      for (int64_t b = b0; b < b1; ++b) {
        T* pose = save ? rows + b * kPoseRow * n : row.data();
        crba_sample(tree, ax, org.at(b), pi.at(b), arm.at(b), qp + b * nq, out + b * nv * nv,
                    pose, pose + 9 * n, Ic.data());
      }
    });
  });
  return {M, saved};
}

// Backward of CRBA from the poses crba_forward saved, for the upstream gradient G (like M):
// (d<G, M>/d inertial or undefined, diag(G) for the armature or undefined), in the
// parameters' shapes (summed over the batch when shared).
std::vector<torch::Tensor> crba_backward(torch::Tensor saved, torch::Tensor G,
                                         torch::Tensor inertial, torch::Tensor armature,
                                         torch::Tensor axis, torch::Tensor parent,
                                         torch::Tensor prismatic, bool need_pi,
                                         bool need_armature) {
  const Tree tree = make_tree(parent, prismatic);
  const int64_t n = tree.n, nv = tree.nv;
  TORCH_CHECK(G.is_contiguous() && G.dim() >= 2 && G.size(-1) == nv && G.size(-2) == nv,
              "grad must be a contiguous (..., nv, nv) tensor");
  const int64_t batch = G.numel() / (nv * nv);
  check_saved(saved, batch, kPoseRow * n);
  const Split split = split_for(batch, batch * n);
  const int64_t chunks = split.chunks;
  std::vector<torch::Tensor> result;
  AT_DISPATCH_FLOATING_TYPES(G.scalar_type(), "crba_backward", [&] {
    using T = scalar_t;
    GradOut<T> gpi(need_pi, inertial, batch, chunks, 10 * n);
    GradOut<T> garm(need_armature, armature, batch, chunks, nv);
    T* rows = saved.data_ptr<T>();
    const T *Gp = G.data_ptr<T>(), *ax = axis.data_ptr<T>();
    for_chunks(batch, split, [&](int64_t c, int64_t b0, int64_t b1) {
      std::vector<T> ws(gpi.active ? 28 * n + 36 : 0);
      for (int64_t b = b0; b < b1; ++b) {
        const T* Gb = Gp + b * nv * nv;
        if (gpi.active) {
          const T* pose = rows + b * kPoseRow * n;
          crba_inertial_adjoint_sample(tree, ax, pose, pose + 9 * n, Gb, gpi.at(c, b),
                                       ws.data());
        }
        if (garm.active) {
          T* ga = garm.at(c, b);
          for (int64_t i = 0; i < nv; ++i) ga[i] += Gb[i * nv + i];
        }
      }
    });
    result = {gpi.finish(), garm.finish()};
  });
  return result;
}


// Joint-steps (samples x steps x substeps x joints) below which a rollout runs on one thread.
constexpr int64_t kMinParallelRolloutWork = 1 << 16;

// Closed-loop rollouts of the semi-implicit Euler ABA step, the whole horizon in one call.
// For every sample b and step t:  dz = [x - x_nom_t; u_{t-1} - previous_t] (the second block
// only when K has nx + nu columns, zero at t = 0),  u_t = clip(u_open[t, b] + K_t dz, lo, hi),
// held over `substeps` steps of
//   tau = command u_t - emf qd - damping qd - friction tanh(qd / velocity_scale),
//   qd += h ABA(q, qd, tau),  q += h qd.
// Returns (states (B, H + 1, 2n) from x0, commands (B, H, nu)).  Parameters are shared (one
// row) by every sample; K_t = 0 gives open-loop rollouts of u_open.
std::vector<torch::Tensor> feedback_rollout(
    torch::Tensor x0, torch::Tensor x_nom, torch::Tensor u_open, torch::Tensor gains,
    torch::Tensor previous, torch::Tensor lower, torch::Tensor upper, torch::Tensor command,
    torch::Tensor emf, torch::Tensor damping, torch::Tensor friction, double velocity_scale,
    double h, int64_t substeps, torch::Tensor inertial, torch::Tensor armature,
    torch::Tensor origins, torch::Tensor gravity, torch::Tensor axis, torch::Tensor parent,
    torch::Tensor prismatic) {
  const Tree tree = make_tree(parent, prismatic);
  TORCH_CHECK(!tree.floating, "feedback_rollout does not take floating-base trees");
  const int64_t n = tree.n, nx = 2 * n;
  TORCH_CHECK(x0.dim() == 2 && x0.size(1) == nx && x0.is_contiguous(),
              "x0 must be contiguous (B, ", nx, ")");
  const int64_t batch = x0.size(0);
  TORCH_CHECK(u_open.dim() == 3 && u_open.size(1) == batch && u_open.is_contiguous(),
              "u_open must be contiguous (H, B, nu)");
  const int64_t horizon = u_open.size(0), nu = u_open.size(2);
  TORCH_CHECK(gains.dim() == 3 && gains.size(0) == horizon && gains.size(1) == nu &&
                  (gains.size(2) == nx || gains.size(2) == nx + nu) && gains.is_contiguous(),
              "gains must be contiguous (H, nu, nx) or (H, nu, nx + nu)");
  const int64_t nz = gains.size(2);
  TORCH_CHECK(x_nom.dim() == 2 && x_nom.size(0) >= horizon && x_nom.size(1) == nx &&
                  x_nom.is_contiguous(), "x_nom must be contiguous (>= H, nx)");
  TORCH_CHECK(nz == nx || (previous.dim() == 2 && previous.size(0) == horizon &&
                           previous.size(1) == nu && previous.is_contiguous()),
              "previous must be contiguous (H, nu) with rate-augmented gains");
  TORCH_CHECK(command.numel() == n * nu && command.is_contiguous(), "command must be (n, nu)");
  TORCH_CHECK(lower.numel() == nu && upper.numel() == nu, "limits must have nu values");
  TORCH_CHECK(emf.numel() == n && damping.numel() == n && friction.numel() == n,
              "emf, damping and friction must have n values");
  TORCH_CHECK(substeps >= 1 && h > 0 && velocity_scale > 0, "need substeps >= 1, h > 0 and "
              "velocity_scale > 0");
  for (const auto* t : {&x_nom, &u_open, &gains, &lower, &upper, &command, &emf, &damping,
                        &friction, &inertial, &armature, &origins, &gravity, &axis}) {
    TORCH_CHECK(t->scalar_type() == x0.scalar_type() && t->is_contiguous(),
                "every tensor must be contiguous and of x0's dtype");
  }
  TORCH_CHECK(nz == nx || previous.scalar_type() == x0.scalar_type(),
              "previous must have x0's dtype");
  auto states = torch::empty({batch, horizon + 1, nx}, x0.options());
  auto controls = torch::empty({batch, horizon, nu}, x0.options());
  AT_DISPATCH_FLOATING_TYPES(x0.scalar_type(), "feedback_rollout", [&] {
    using T = scalar_t;
    const auto pi = param<T>(inertial, 1, 10 * n, "inertial");
    const auto arm = param<T>(armature, 1, n, "armature");
    const auto org = param<T>(origins, 1, 16 * n, "origins");
    const auto grav = param<T>(gravity, 1, 3, "gravity");
    const T *ax = axis.data_ptr<T>(), *xn = x_nom.data_ptr<T>(), *uo = u_open.data_ptr<T>();
    const T *Kp = gains.data_ptr<T>(), *lo = lower.data_ptr<T>(), *hi = upper.data_ptr<T>();
    const T *Bc = command.data_ptr<T>(), *ce = emf.data_ptr<T>(), *cd = damping.data_ptr<T>();
    const T* cf = friction.data_ptr<T>();
    const T* prev = nz > nx ? previous.data_ptr<T>() : nullptr;
    const T *x0p = x0.data_ptr<T>();
    T *xs = states.data_ptr<T>(), *us = controls.data_ptr<T>();
    const T step = static_cast<T>(h), inv_scale = static_cast<T>(1.0 / velocity_scale);
    // Every sample runs the whole horizon; samples are independent, so the chunks are too.
    // A solve's rollouts (a few samples, or one step of a few hundred Jacobian probes) take
    // 0.1-1 ms: split over threads on a shared machine they waited for a descheduled thread
    // (Qube solve p50 1.3 -> 6 ms with 2 threads beside one busy core), so only MPPI-sized
    // work is split.
    const int64_t work = batch * horizon * substeps * n;
    Split split = work < kMinParallelRolloutWork ? Split{1, 1}
                                                 : split_for(batch * horizon * substeps, work);
    split.chunks = std::min<int64_t>(split.chunks, batch);
    split.threads = std::min<int64_t>(split.threads, split.chunks);
    for_chunks(batch, split, [&](int64_t, int64_t b0, int64_t b1) {
      AbaScratch<T> ws(tree);
      std::vector<T> dz(nz), tau(n), qdd(n), x(nx);
      T* row = ws.row();
      const Kin<T> k(row, n);
      for (int64_t b = b0; b < b1; ++b) {
        for (int64_t i = 0; i < nx; ++i) x[i] = x0p[b * nx + i];
        T* xb = xs + b * (horizon + 1) * nx;
        T* ub = us + b * horizon * nu;
        std::copy(x.begin(), x.end(), xb);
        for (int64_t t = 0; t < horizon; ++t) {
          for (int64_t i = 0; i < nx; ++i) dz[i] = x[i] - xn[t * nx + i];
          for (int64_t j = 0; j < nz - nx; ++j) {
            dz[nx + j] = t > 0 ? ub[(t - 1) * nu + j] - prev[t * nu + j] : T(0);
          }
          T* u = ub + t * nu;
          const T* Kt = Kp + t * nu * nz;
          for (int64_t j = 0; j < nu; ++j) {
            T v = uo[(t * batch + b) * nu + j];
            for (int64_t i = 0; i < nz; ++i) v += Kt[j * nz + i] * dz[i];
            u[j] = std::min(std::max(v, lo[j]), hi[j]);
          }
          T* q = x.data();
          T* qd = x.data() + n;
          for (int64_t s = 0; s < substeps; ++s) {
            for (int64_t i = 0; i < n; ++i) {
              T v = -(ce[i] + cd[i]) * qd[i] - cf[i] * std::tanh(qd[i] * inv_scale);
              for (int64_t j = 0; j < nu; ++j) v += Bc[i * nu + j] * u[j];
              tau[i] = v;
            }
            aba_sample(tree, ax, org.at(0), pi.at(0), arm.at(0), grav.at(0), q, qd,
                       tau.data(), qdd.data(), k, row + kKinRow * n, row + (kKinRow + 6) * n,
                       static_cast<T*>(nullptr), ws);
            for (int64_t i = 0; i < n; ++i) {
              qd[i] += step * qdd[i];
              q[i] += step * qd[i];
            }
          }
          std::copy(x.begin(), x.end(), xb + (t + 1) * nx);
        }
      }
    });
  });
  return {states, controls};
}

// ---------------------------------------------------------------------------------------
// Box-constrained Riccati recursion of control-limited iLQR (float64)
// ---------------------------------------------------------------------------------------

// The free block of H (rows/columns where free) into out, packed; returns its size.
int64_t free_block(const double* H, int64_t m, const std::vector<char>& free, double* out) {
  const int64_t size = std::count(free.begin(), free.begin() + m, char(1));
  int64_t r = 0;
  for (int64_t i = 0; i < m; ++i) {
    if (!free[i]) continue;
    int64_t c = 0;
    for (int64_t j = 0; j < m; ++j) {
      if (free[j]) out[r * size + c++] = H[i * m + j];
    }
    ++r;
  }
  return size;
}

double quadratic(const double* H, const double* g, const double* x, int64_t m) {
  double v = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    double hx = 0.0;
    for (int64_t j = 0; j < m; ++j) hx += H[i * m + j] * x[j];
    v += 0.5 * x[i] * hx + g[i] * x[i];
  }
  return v;
}

void free_set(const double* H, const double* g, const double* x, const double* lo,
              const double* hi, const double* slack, int64_t m, std::vector<char>& free,
              double* grad) {
  for (int64_t i = 0; i < m; ++i) {
    double s = g[i];
    for (int64_t j = 0; j < m; ++j) s += H[i * m + j] * x[j];
    grad[i] = s;
    free[i] = !((x[i] <= lo[i] + slack[i] && s > 0) || (x[i] >= hi[i] - slack[i] && s < 0));
  }
}

// Projected-Newton box QP (Tassa et al. 2014, Algorithm 3), started from the clipped zero:
// minimises 0.5 x'Hx + g'x on [lo, hi]; false when a free block is not positive definite.
bool box_qp(const double* H, const double* g, const double* lo, const double* hi, int64_t m,
            double* x, std::vector<char>& free) {
  std::vector<double> grad(m), step(m), cand(m), block(m * m), L(m * m), slack(m), rhs(m);
  for (int64_t i = 0; i < m; ++i) {
    x[i] = std::min(std::max(0.0, lo[i]), hi[i]);
    slack[i] = 1e-9 * (1.0 + std::abs(x[i]));
  }
  for (int iter = 0; iter < 50; ++iter) {
    free_set(H, g, x, lo, hi, slack.data(), m, free, grad.data());
    bool any = false;
    for (int64_t i = 0; i < m; ++i) any = any || free[i];
    if (!any) break;
    const int64_t size = free_block(H, m, free, block.data());
    for (int64_t i = 0; i < size * size; ++i) {
      if (!std::isfinite(block[i])) return false;
    }
    if (!cholesky(block.data(), size, L.data())) return false;
    int64_t r = 0;
    for (int64_t i = 0; i < m; ++i) {
      if (free[i]) rhs[r++] = grad[i];
    }
    cholesky_solve(L.data(), size, rhs.data());
    r = 0;
    double step_max = 0.0, x_max = 0.0;
    for (int64_t i = 0; i < m; ++i) {
      step[i] = free[i] ? -rhs[r++] : 0.0;
      step_max = std::max(step_max, std::abs(step[i]));
      x_max = std::max(x_max, std::abs(x[i]));
    }
    if (step_max <= 1e-12 * (1.0 + x_max)) break;
    const double value = quadratic(H, g, x, m);
    double alpha = 1.0;
    bool accepted = false;
    while (alpha > 1e-10) {
      for (int64_t i = 0; i < m; ++i) {
        cand[i] = std::min(std::max(x[i] + alpha * step[i], lo[i]), hi[i]);
      }
      if (quadratic(H, g, cand.data(), m) <= value + 1e-12 * (1.0 + std::abs(value))) {
        accepted = true;
        break;
      }
      alpha *= 0.5;
    }
    if (!accepted) break;
    std::copy(cand.begin(), cand.end(), x);
  }
  free_set(H, g, x, lo, hi, slack.data(), m, free, grad.data());
  return true;
}

// The backward pass of ilqr._backward_pass: returns {k (H, nu), K (H, nu, nz),
// dv (2,) = (sum k.Qu, sum 0.5 k.Quu.k)}, or empty tensors when some regularised free block
// of Quu is not positive definite (the caller raises mu).
std::vector<torch::Tensor> riccati_backward(torch::Tensor F, torch::Tensor l_grad,
                                            torch::Tensor l_hess, torch::Tensor vz_final,
                                            torch::Tensor vzz_final, torch::Tensor controls,
                                            torch::Tensor u_min, torch::Tensor u_max,
                                            double mu) {
  for (const auto* t : {&F, &l_grad, &l_hess, &vz_final, &vzz_final, &controls, &u_min,
                        &u_max}) {
    TORCH_CHECK(t->scalar_type() == torch::kFloat64 && t->is_contiguous() && t->is_cpu(),
                "riccati_backward takes contiguous float64 CPU tensors");
  }
  TORCH_CHECK(F.dim() == 3 && controls.dim() == 2 && F.size(0) == controls.size(0),
              "F must be (H, nz, nz + nu) and controls (H, nu)");
  const int64_t H = F.size(0), nz = F.size(1), nu = controls.size(1), m = nz + nu;
  TORCH_CHECK(F.size(2) == m && l_grad.size(0) == H && l_grad.size(1) == m &&
                  l_hess.size(0) == H && l_hess.size(1) == m && l_hess.size(2) == m &&
                  vz_final.numel() == nz && vzz_final.numel() == nz * nz &&
                  u_min.numel() == nu && u_max.numel() == nu,
              "inconsistent shapes in riccati_backward");
  auto ks = torch::zeros({H, nu}, controls.options());
  auto Ks = torch::zeros({H, nu, nz}, controls.options());
  const double *Fp = F.data_ptr<double>(), *lg = l_grad.data_ptr<double>();
  const double *lh = l_hess.data_ptr<double>(), *U = controls.data_ptr<double>();
  const double *umin = u_min.data_ptr<double>(), *umax = u_max.data_ptr<double>();
  double *kp = ks.data_ptr<double>(), *Kp = Ks.data_ptr<double>();
  std::vector<double> vz(vz_final.data_ptr<double>(), vz_final.data_ptr<double>() + nz);
  std::vector<double> vzz(vzz_final.data_ptr<double>(),
                          vzz_final.data_ptr<double>() + nz * nz);
  std::vector<double> Qg(m), Qh(m * m), VF(nz * m), Quu(nu * nu), lo(nu), hi(nu), k(nu);
  std::vector<double> block(nu * nu), L(nu * nu), rhs(nu), Quu_k(nu), KQ(nz * nz);
  std::vector<double> vz_new(nz), vzz_new(nz * nz), KtQuu(nz * nu);
  std::vector<char> free(nu);
  double dv1 = 0.0, dv2 = 0.0;
  for (int64_t t = H - 1; t >= 0; --t) {
    const double* Ft = Fp + t * nz * m;
    // Q_grad = l_grad + F^T vz, Q_hess = l_hess + F^T (vzz F)
    for (int64_t a = 0; a < m; ++a) {
      double s = lg[t * m + a];
      for (int64_t i = 0; i < nz; ++i) s += Ft[i * m + a] * vz[i];
      Qg[a] = s;
    }
    for (int64_t i = 0; i < nz; ++i) {
      for (int64_t a = 0; a < m; ++a) {
        double s = 0.0;
        for (int64_t j = 0; j < nz; ++j) s += vzz[i * nz + j] * Ft[j * m + a];
        VF[i * m + a] = s;
      }
    }
    for (int64_t a = 0; a < m; ++a) {
      for (int64_t b = 0; b < m; ++b) {
        double s = lh[(t * m + a) * m + b];
        for (int64_t i = 0; i < nz; ++i) s += Ft[i * m + a] * VF[i * m + b];
        Qh[a * m + b] = s;
      }
    }
    const double* Qu = Qg.data() + nz;
    for (int64_t a = 0; a < nu; ++a) {
      for (int64_t b = 0; b < nu; ++b) Quu[a * nu + b] = Qh[(nz + a) * m + nz + b];
      lo[a] = umin[a] - U[t * nu + a];
      hi[a] = umax[a] - U[t * nu + a];
    }
    double* K = Kp + t * nu * nz;   // zero-initialised: rows of clamped commands stay 0
    if (nu == 1) {
      const double h = Quu[0] + mu;
      if (!(h > 0) || !std::isfinite(h)) return {};
      const double unconstrained = -Qu[0] / h;
      k[0] = std::min(std::max(unconstrained, lo[0]), hi[0]);
      if (unconstrained == k[0]) {
        for (int64_t i = 0; i < nz; ++i) K[i] = Qh[nz * m + i] * (-1.0 / h);
      }
    } else {
      std::vector<double> reg(Quu);
      for (int64_t a = 0; a < nu; ++a) reg[a * nu + a] += mu;
      if (!box_qp(reg.data(), Qu, lo.data(), hi.data(), nu, k.data(), free)) return {};
      bool any = false;
      for (int64_t a = 0; a < nu; ++a) any = any || free[a];
      if (any) {
        const int64_t size = free_block(reg.data(), nu, free, block.data());
        for (int64_t i = 0; i < size * size; ++i) {
          if (!std::isfinite(block[i])) return {};
        }
        if (!cholesky(block.data(), size, L.data())) return {};
        for (int64_t i = 0; i < nz; ++i) {   // K[free] = -block^-1 Quz[free], column i
          int64_t r = 0;
          for (int64_t a = 0; a < nu; ++a) {
            if (free[a]) rhs[r++] = Qh[(nz + a) * m + i];
          }
          cholesky_solve(L.data(), size, rhs.data());
          r = 0;
          for (int64_t a = 0; a < nu; ++a) {
            if (free[a]) K[a * nz + i] = -rhs[r++];
          }
        }
      }
    }
    // vz = Qz + K^T (Quu k + Qu) + Quz^T k;  vzz = Qzz + K^T Quu K + K^T Quz + Quz^T K
    for (int64_t a = 0; a < nu; ++a) {
      double s = 0.0;
      for (int64_t b = 0; b < nu; ++b) s += Quu[a * nu + b] * k[b];
      Quu_k[a] = s;
    }
    for (int64_t i = 0; i < nz; ++i) {
      double s = Qg[i];
      for (int64_t a = 0; a < nu; ++a) {
        s += K[a * nz + i] * (Quu_k[a] + Qu[a]) + Qh[(nz + a) * m + i] * k[a];
      }
      vz_new[i] = s;
      for (int64_t b = 0; b < nu; ++b) {
        double w = 0.0;
        for (int64_t a = 0; a < nu; ++a) w += K[a * nz + i] * Quu[a * nu + b];
        KtQuu[i * nu + b] = w;
      }
    }
    for (int64_t i = 0; i < nz; ++i) {
      for (int64_t j = 0; j < nz; ++j) {
        double kq = 0.0;
        for (int64_t a = 0; a < nu; ++a) kq += K[a * nz + i] * Qh[(nz + a) * m + j];
        KQ[i * nz + j] = kq;
      }
    }
    for (int64_t i = 0; i < nz; ++i) {
      for (int64_t j = 0; j < nz; ++j) {
        double s = Qh[i * m + j] + KQ[i * nz + j] + KQ[j * nz + i];
        for (int64_t b = 0; b < nu; ++b) s += KtQuu[i * nu + b] * K[b * nz + j];
        vzz_new[i * nz + j] = s;
      }
    }
    for (int64_t i = 0; i < nz; ++i) {
      for (int64_t j = 0; j < nz; ++j) {
        vzz[i * nz + j] = 0.5 * (vzz_new[i * nz + j] + vzz_new[j * nz + i]);
      }
    }
    vz = vz_new;
    for (int64_t a = 0; a < nu; ++a) {
      dv1 += k[a] * Qu[a];
      dv2 += 0.5 * k[a] * Quu_k[a];
      kp[t * nu + a] = k[a];
    }
  }
  auto dv = torch::tensor({dv1, dv2}, controls.options());
  return {ks, Ks, dv};
}
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rnea_forward", &rnea_forward,
        "Batched RNEA, one fused recursion per sample; optionally saves the kinematics");
  m.def("rnea_backward", &rnea_backward,
        "Vector-Jacobian products of RNEA w.r.t. q, qd, qdd, inertial and armature, from "
        "saved rows");
  m.def("aba_forward", &aba_forward,
        "Batched ABA, one fused recursion per sample; optionally saves kinematics, U and D");
  m.def("aba_backward", &aba_backward,
        "Vector-Jacobian products of ABA w.r.t. q, qd, tau, inertial and armature, from saved "
        "rows");
  m.def("rnea_derivatives", &rnea_derivatives,
        "Batched RNEA with its Jacobians w.r.t. q, qd, qdd (and the inertial parameters), "
        "one adjoint sweep per row");
  m.def("aba_derivatives", &aba_derivatives,
        "Batched ABA with its Jacobians w.r.t. q, qd and tau (M^-1), one solve and one RNEA "
        "adjoint sweep per row");
  py::class_<BoundModel>(m, "BoundModel")
      .def(py::init<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor,
                    torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor>())
      .def("rnea", &BoundModel::rnea, "RNEA of a common call without gradients, else None")
      .def("aba", &BoundModel::aba, "ABA of a common call without gradients, else None")
      .def("rnea_jacobians", &BoundModel::rnea_jacobians,
           "rnea_derivatives of a common call, else None")
      .def("aba_jacobians", &BoundModel::aba_jacobians,
           "aba_derivatives of a common call, else None");
  m.def("threads_for", &threads_for,
        "Threads a dynamics call of B samples of an n-joint tree runs on");
  m.def("crba_forward", &crba_forward,
        "Batched CRBA, one composite-inertia recursion per sample; optionally saves the poses");
  m.def("crba_backward", &crba_backward,
        "Inertial/armature vector-Jacobian products of CRBA, from saved poses");
  // The control kernels run in the mpc node's solver thread beside its command timer: they
  // touch no Python object once their arguments are converted, so they let the GIL go.
  m.def("feedback_rollout", &feedback_rollout,
        "Closed-loop semi-implicit Euler rollouts of ABA under affine feedback, clipped",
        py::call_guard<py::gil_scoped_release>());
  m.def("riccati_backward", &riccati_backward,
        "Box-constrained Riccati recursion of control-limited iLQR (projected Newton QPs)",
        py::call_guard<py::gil_scoped_release>());
}
