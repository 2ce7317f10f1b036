// Batched generation as llama.cpp's batched-bench measures it: npl
// sequences, a prompt of pp tokens each decoded together, then tg steps of
// one token per sequence per llama_decode (greedy argmax on the host, as
// the worker does), unified KV off, threads as given.
#include "llama.h"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
int main(int argc, char **argv) {
  const char *path = argv[1];
  int npl = atoi(argv[2]), pp = atoi(argv[3]), tg = atoi(argv[4]), th = atoi(argv[5]);
  llama_backend_init();
  auto mp = llama_model_default_params();
  llama_model *model = llama_model_load_from_file(path, mp);
  const llama_vocab *vocab = llama_model_get_vocab(model);
  int n_vocab = llama_vocab_n_tokens(vocab);
  auto cp = llama_context_default_params();
  cp.n_ctx = npl * (pp + tg); cp.n_batch = 512; cp.n_ubatch = 512; cp.n_seq_max = npl;
  cp.kv_unified = false; cp.n_threads = th; cp.n_threads_batch = th; cp.no_perf = true;
  llama_context *ctx = llama_init_from_model(model, cp);
  llama_batch b = llama_batch_init(512, 0, 1);
  for (int rep = 0; rep < 2; rep++) {
    llama_memory_clear(llama_get_memory(ctx), true);
    auto t0 = std::chrono::steady_clock::now();
    std::vector<int> last(npl);
    // prefill
    std::vector<std::pair<int,int>> all;
    for (int s = 0; s < npl; s++) for (int j = 0; j < pp; j++) all.push_back({s, j});
    for (size_t i = 0; i < all.size(); i += 512) {
      b.n_tokens = 0;
      std::vector<int> rows;
      for (size_t k = i; k < all.size() && k < i + 512; k++) {
        int s = all[k].first, j = all[k].second, n = b.n_tokens++;
        b.token[n] = 100 + (j * 7 + s) % 500; b.pos[n] = j; b.n_seq_id[n] = 1; b.seq_id[n][0] = s;
        b.logits[n] = j == pp - 1; if (j == pp - 1) rows.push_back(n);
      }
      if (llama_decode(ctx, b)) { fprintf(stderr, "decode failed\n"); return 1; }
      for (int n : rows) { float *l = llama_get_logits_ith(ctx, n); int best = 0; for (int v = 1; v < n_vocab; v++) if (l[v] > l[best]) best = v; last[b.seq_id[n][0]] = best; }
    }
    auto t1 = std::chrono::steady_clock::now();
    for (int t = 0; t < tg; t++) {
      b.n_tokens = 0;
      for (int s = 0; s < npl; s++) { int n = b.n_tokens++; b.token[n] = last[s]; b.pos[n] = pp + t; b.n_seq_id[n] = 1; b.seq_id[n][0] = s; b.logits[n] = 1; }
      if (llama_decode(ctx, b)) { fprintf(stderr, "decode failed\n"); return 1; }
      for (int n = 0; n < npl; n++) { float *l = llama_get_logits_ith(ctx, n); int best = 0; for (int v = 1; v < n_vocab; v++) if (l[v] > l[best]) best = v; last[n] = best; }
    }
    auto t2 = std::chrono::steady_clock::now();
    double pps = std::chrono::duration<double>(t1 - t0).count(), tgs = std::chrono::duration<double>(t2 - t1).count();
    printf("rep %d npl %d pp %d tg %d threads %d: prefill %.3f s (%.0f t/s), generation %.3f s (%.0f t/s), total %.3f s (%.0f t/s)\n", rep, npl, pp, tg, th, pps, npl*pp/pps, tgs, npl*tg/tgs, pps+tgs, npl*(pp+tg)/(pps+tgs));
  }
  return 0;
}
