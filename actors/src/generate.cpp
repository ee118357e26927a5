#include "troupe/actors/generate.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <optional>
#include <stdexcept>

namespace troupe::actors {
namespace {

struct Layout {
  at::Tensor tokens, attn_mask, prompt_lens;   // [N, P + max_new], [N, P + max_new], [N]
  std::int64_t rows = 0, prompt_len = 0;
};

// Left-pads the prompts into [N, P + max_new] with each prompt repeated `samples` times; P is
// `width`, or the longest prompt when it is 0.
Layout lay_out(const std::vector<std::vector<std::int32_t>>& prompts, std::int32_t samples, std::int64_t max_new,
               std::int64_t width, const PolicyConfig& config) {
  Layout l;
  for (auto& p : prompts) {
    if (p.empty()) throw std::invalid_argument("generate: empty prompt");
    l.prompt_len = std::max<std::int64_t>(l.prompt_len, std::int64_t(p.size()));
  }
  if (width > 0) {
    if (l.prompt_len > width)
      throw std::invalid_argument("generate: a prompt of " + std::to_string(l.prompt_len) + " tokens is longer than the batch's width of " +
                                  std::to_string(width));
    l.prompt_len = width;
  }
  if (l.prompt_len + max_new > config.context)
    throw std::invalid_argument("generate: prompt (" + std::to_string(l.prompt_len) + ") + max_new_tokens (" +
                                std::to_string(max_new) + ") exceeds the context (" + std::to_string(config.context) + ")");
  l.rows = std::int64_t(prompts.size()) * samples;
  const std::int64_t columns = l.prompt_len + max_new;
  l.tokens = at::zeros({l.rows, columns}, at::kLong);
  l.attn_mask = at::zeros({l.rows, columns}, at::kBool);
  l.prompt_lens = at::empty({l.rows}, at::kLong);
  auto tok = l.tokens.accessor<std::int64_t, 2>();
  auto mask = l.attn_mask.accessor<bool, 2>();
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    for (std::int32_t s = 0; s < samples; ++s) {
      const std::int64_t r = std::int64_t(i) * samples + s, pad = l.prompt_len - std::int64_t(prompts[i].size());
      l.prompt_lens[r] = std::int64_t(prompts[i].size());
      for (std::size_t j = 0; j < prompts[i].size(); ++j) {
        if (prompts[i][j] < 0 || prompts[i][j] >= config.vocab_size) throw std::invalid_argument("generate: token id outside the vocabulary");
        tok[r][pad + std::int64_t(j)] = prompts[i][j];
        mask[r][pad + std::int64_t(j)] = true;
      }
    }
  }
  return l;
}

// Logits [N, V] for the last column of tokens[:, :width], recomputing or extending the cache.
at::Tensor next_logits(const Model& policy, const Layout& l, std::int64_t width, DecodeCache* cache, bool prefill) {
  auto mask = l.attn_mask.narrow(1, 0, width);
  if (cache == nullptr || prefill) {
    auto toks = l.tokens.narrow(1, 0, width);
    auto logits = policy.forward(toks, positions_from_mask(mask), mask, cache, 0);
    return logits.select(1, width - 1);
  }
  auto pos = (l.prompt_lens + (width - 1 - l.prompt_len)).view({-1, 1});
  auto logits = policy.forward(l.tokens.narrow(1, width - 1, 1), pos, mask, cache, width - 1);
  return logits.select(1, 0);
}

// The first logits [N, V] of a batch whose rows are each prompt `samples` times, the cache filled
// with the prompts: prefilled once per prompt and repeated into every sample's rows, since a
// prompt's samples share its prefix. Undefined (the cache untouched) when the model's cache cannot
// take repeated rows.
at::Tensor shared_prefill(const Model& policy, const std::vector<std::vector<std::int32_t>>& prompts, std::int32_t samples,
                          const Layout& l, std::int64_t max_new, DecodeCache& cache) {
  const Layout once = lay_out(prompts, 1, max_new, l.prompt_len, policy.config());
  auto prefix = policy.make_cache(once.rows, l.prompt_len);
  if (prefix == nullptr) return {};
  auto logits = next_logits(policy, once, l.prompt_len, prefix.get(), true);
  if (!cache.repeat_rows(*prefix, samples, l.prompt_len)) return {};
  return logits.repeat_interleave(samples, 0);
}

}  // namespace

namespace {
// SplitMix64's finaliser.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

std::uint64_t sample_stream(std::uint64_t seed, std::int64_t prompt, std::int64_t sample) {
  return mix(mix(seed ^ mix(std::uint64_t(prompt))) ^ mix(~std::uint64_t(sample)));
}

double uniform(std::uint64_t stream, std::int64_t t) {
  return (double(mix(stream ^ mix(std::uint64_t(t))) >> 11) + 0.5) * 0x1.0p-53;   // never 0 or 1
}

at::Tensor sample_tokens(const at::Tensor& logits, const SamplingParams& params, const at::Tensor& uniforms,
                         at::Tensor* logprob) {
  const bool greedy = params.temperature <= 0.0f;
  auto logp = at::log_softmax(greedy ? logits : logits.div(params.temperature), -1);
  at::Tensor token;
  if (greedy) {
    token = logp.argmax(-1);
  } else {
    auto probs = logp.exp().to(at::kDouble);
    at::Tensor order;
    if (params.top_p < 1.0f) {
      // Keep the smallest prefix of the sorted distribution whose mass reaches top_p (at least one).
      auto [sorted, o] = probs.sort(/*stable=*/true, -1, /*descending=*/true);
      auto before = sorted.cumsum(-1).sub_(sorted);
      probs = sorted.masked_fill(before.ge(params.top_p), 0.0);
      order = o;
    }
    // The first token whose cumulative mass reaches u * total (u > 0: a token of mass 0 is never drawn).
    auto cdf = probs.cumsum(-1);
    const std::int64_t v = cdf.size(1);
    auto goal = uniforms.view({-1, 1}).mul(cdf.narrow(1, v - 1, 1));
    auto pick = cdf.lt(goal).sum(-1).clamp_max(v - 1);
    token = order.defined() ? order.gather(1, pick.view({-1, 1})).view({-1}) : pick;
  }
  if (logprob != nullptr) *logprob = logp.gather(1, token.view({-1, 1})).view({-1});
  return token;
}

Generation generate(const Model& policy, const std::vector<std::vector<std::int32_t>>& prompts,
                    std::int32_t samples_per_prompt, const SamplingParams& params, bool use_cache, BatchPart part,
                    std::unique_ptr<DecodeCache>* keep) {
  at::NoGradGuard no_grad;   // not InferenceMode: the outputs feed autograd in the trainer
  if (samples_per_prompt < 1 || params.max_new_tokens < 1) throw std::invalid_argument("generate: nothing to sample");
  if (!part.prompt_index.empty() && part.prompt_index.size() != prompts.size())
    throw std::invalid_argument("generate: " + std::to_string(part.prompt_index.size()) + " prompt indices for " +
                                std::to_string(prompts.size()) + " prompts");
  if (part.prompt_width < 0 || std::any_of(part.prompt_index.begin(), part.prompt_index.end(), [](std::int64_t i) { return i < 0; }))
    throw std::invalid_argument("generate: a negative place in the batch");
  Layout l = lay_out(prompts, samples_per_prompt, params.max_new_tokens, part.prompt_width, policy.config());
  const std::int64_t p = l.prompt_len;
  std::vector<std::uint64_t> streams(std::size_t(l.rows));
  for (std::int64_t r = 0; r < l.rows; ++r) {
    const std::int64_t i = r / samples_per_prompt;
    streams[std::size_t(r)] = sample_stream(params.seed, part.prompt_index.empty() ? i : part.prompt_index[std::size_t(i)],
                                            r % samples_per_prompt);
  }
  auto uniforms = at::empty({l.rows}, at::kDouble);
  // A model that makes no cache decodes without one: next_logits then passes the whole prefix.
  std::unique_ptr<DecodeCache> made;
  DecodeCache* cache = nullptr;
  if (use_cache) {
    if (keep != nullptr && *keep != nullptr && (*keep)->reuse(l.rows, p + params.max_new_tokens)) {
      cache = keep->get();
    } else {
      made = policy.make_cache(l.rows, p + params.max_new_tokens);
      cache = made.get();
    }
  }
  auto logprobs = at::zeros(l.tokens.sizes(), at::kFloat);
  auto response_mask = at::zeros(l.tokens.sizes(), at::kBool);
  auto done = at::zeros({l.rows}, at::kBool);
  std::int64_t width = p;
  for (std::int64_t s = 0; s < params.max_new_tokens; ++s) {
    at::Tensor logits;
    if (s == 0 && cache != nullptr && samples_per_prompt > 1)
      logits = shared_prefill(policy, prompts, samples_per_prompt, l, params.max_new_tokens, *cache);
    if (!logits.defined()) logits = next_logits(policy, l, width, cache, s == 0);
    at::Tensor lp;
    if (params.temperature > 0.0f) {
      auto u = uniforms.accessor<double, 1>();
      for (std::int64_t r = 0; r < l.rows; ++r) u[r] = uniform(streams[std::size_t(r)], s);
    }
    auto token = sample_tokens(logits, params, uniforms, &lp);
    auto live = done.logical_not();
    l.tokens.select(1, width).copy_(token.masked_fill(done, 0));
    l.attn_mask.select(1, width).copy_(live);
    response_mask.select(1, width).copy_(live);
    logprobs.select(1, width).copy_(lp.masked_fill(done, 0.0));
    ++width;
    if (params.stop_token >= 0) done.logical_or_(token.eq(params.stop_token));
    if (done.all().item<bool>()) break;
  }
  if (keep != nullptr && made != nullptr) *keep = std::move(made);
  Generation g;
  g.tokens = l.tokens.narrow(1, 0, width).contiguous();
  g.attn_mask = l.attn_mask.narrow(1, 0, width).contiguous();
  g.response_mask = response_mask.narrow(1, 0, width).contiguous();
  g.logprobs = logprobs.narrow(1, 0, width).contiguous();
  g.prompt_len = std::int32_t(p);
  g.generated_tokens = g.response_mask.sum().item<std::int64_t>();
  g.responses.reserve(std::size_t(l.rows), std::size_t(g.generated_tokens));
  g.finished.assign(std::size_t(l.rows), 0);
  auto tok = g.tokens.accessor<std::int64_t, 2>();
  auto resp = g.response_mask.accessor<bool, 2>();
  std::vector<std::int32_t> row;
  for (std::int64_t r = 0; r < l.rows; ++r) {
    row.clear();
    for (std::int64_t c = p; c < width && resp[r][c]; ++c) {
      if (tok[r][c] == params.stop_token) { g.finished[std::size_t(r)] = 1; break; }
      row.push_back(std::int32_t(tok[r][c]));
    }
    g.responses.push_back(row);
  }
  return g;
}

}  // namespace troupe::actors
