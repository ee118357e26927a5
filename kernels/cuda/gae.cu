// Kernel 6 on the GPU: one warp per row, a chunked reverse scan. The recursion is sequential along
// a row, but each token is an affine map of the state the scan carries back, (V_next, A_next):
//   valid token t:  (V, A) -> (v_t, r_t - v_t + gamma * V + gamma * lambda * A)
//   masked token:   (V, A) -> (V, A)
// Maps compose, so a row is cut into tiles of 32 * kPer tokens, right to left; in a tile each lane
// composes the maps of its kPer contiguous tokens (pass 1), a warp suffix scan gives each lane the
// state entering its chunk, and each lane runs detail::gae_steps (the CPU twin's scan) from that state
// (pass 2, the loads hit L1). All in fp64, like the CPU twin; only the state at each chunk's right
// edge is reached by another order of operations (a few ulps of fp64 apart).
// A tile's outgoing state is lane 0's once its steps are done. Measured on an H200
// (bench/device/kernels.sh, 512 rows x 1024 tokens, random mask): 22.4-22.9 us in three runs, against
// 450 us for the first version (a thread per row running gae_row); 0 error against the CPU twin,
// edge shapes (tile and chunk borders, all-masked rows, left padding, one valid token) included.
#include "common.cuh"
#include "detail/check.hpp"
#include "detail/formulas.hpp"
#include "troupe/kernels/cuda.hpp"

namespace troupe::kernels::cuda {
namespace {

constexpr int kWarps = 4;         // rows per block
constexpr int kThreads = 32 * kWarps;
constexpr int kPer = 16;          // tokens per lane per tile
constexpr std::int64_t kTile = 32 * kPer;

// state (V, A) -> (has ? v : V, c + av * V + aa * A)
struct Map {
  double c, av, aa, v;
  int has;
};

__device__ Map identity_map() { return {0.0, 0.0, 1.0, 0.0, 0}; }

// f after g: (f o g)(s) = f(g(s)).
__device__ Map after(const Map& f, const Map& g) {
  Map m;
  m.has = f.has | g.has;
  m.v = f.has ? f.v : g.v;
  m.aa = f.aa * g.aa;
  if (g.has) {
    m.c = f.c + f.aa * g.c + f.av * g.v;
    m.av = f.aa * g.av;
  } else {
    m.c = f.c + f.aa * g.c;
    m.av = f.av + f.aa * g.av;
  }
  return m;
}

// Applies `m` to the state (V, A) in place.
__device__ void apply(const Map& m, double& V, double& A) {
  A = m.c + m.av * V + m.aa * A;
  if (m.has) V = m.v;
}

__device__ Map shfl_down(const Map& m, int by) {
  return {__shfl_down_sync(0xffffffffu, m.c, by), __shfl_down_sync(0xffffffffu, m.av, by),
          __shfl_down_sync(0xffffffffu, m.aa, by), __shfl_down_sync(0xffffffffu, m.v, by),
          __shfl_down_sync(0xffffffffu, m.has, by)};
}

__global__ __launch_bounds__(kThreads) void gae_kernel(const float* __restrict__ rewards,
                                                       const float* __restrict__ values,
                                                       const std::uint8_t* __restrict__ mask, std::int64_t rows,
                                                       std::int64_t tokens, double gamma, double gamma_lambda,
                                                       float* __restrict__ adv, float* __restrict__ ret) {
  const int lane = int(threadIdx.x % 32);
  const std::int64_t warps = std::int64_t(gridDim.x) * kWarps;
  for (std::int64_t row = std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; row < rows; row += warps) {
    const float* r = rewards + row * tokens;
    const float* v = values + row * tokens;
    const std::uint8_t* m = mask ? mask + row * tokens : nullptr;
    float* a_out = adv + row * tokens;
    float* ret_out = ret + row * tokens;
    double carry_v = 0.0, carry_a = 0.0;  // the state entering the tile from its right
    for (std::int64_t tile_end = tokens; tile_end > 0; tile_end -= kTile) {
      const std::int64_t end = tile_end - kTile + std::int64_t(lane + 1) * kPer;  // this lane's chunk
      const std::int64_t begin = end - kPer > 0 ? end - kPer : 0;
      // Pass 1: the map of this lane's chunk, last token first.
      Map own = identity_map();
      for (std::int64_t t = end - 1; t >= begin; --t) {
        if (m != nullptr && m[t] == 0) continue;
        const double vt = v[t];
        own = after(Map{double(r[t]) - vt, gamma, gamma_lambda, vt, 1}, own);
      }
      // Suffix scan: lane L ends with the map of lanes L..31 (the lanes to its right act first).
      Map suffix = own;
      for (int by = 1; by < 32; by <<= 1) {
        const Map right = shfl_down(suffix, by);
        if (lane + by < 32) suffix = after(suffix, right);
      }
      Map entering = shfl_down(suffix, 1);
      if (lane == 31) entering = identity_map();
      // Pass 2: the per-token steps from the state entering this chunk.
      double next_value = carry_v, next_adv = carry_a;
      apply(entering, next_value, next_adv);
      ::troupe::kernels::detail::gae_steps(r, v, m, begin, end, gamma, gamma_lambda, next_value, next_adv, a_out,
                                           ret_out);
      // The state entering the next tile: lane 0's state when it is done (every lane's map applied).
      carry_v = __shfl_sync(0xffffffffu, next_value, 0);
      carry_a = __shfl_sync(0xffffffffu, next_adv, 0);
    }
  }
}

}  // namespace

Status gae(const float* rewards, const float* values, const std::uint8_t* mask, std::int64_t rows,
           std::int64_t tokens, float* advantages, float* returns, const GaeOptions& o, Stream stream) {
  TROUPE_RETURN_IF_ERROR(device_status());
  TROUPE_RETURN_IF_ERROR(::troupe::kernels::detail::check_gae(rewards, values, rows, tokens, advantages, returns, o));
  if (rows == 0 || tokens == 0) return {};
  gae_kernel<<<detail::grid_for(rows, kWarps), kThreads, 0, detail::to_stream(stream)>>>(
      rewards, values, mask, rows, tokens, o.gamma, double(o.gamma) * double(o.lambda), advantages, returns);
  return detail::launch_status("gae");
}

}  // namespace troupe::kernels::cuda
