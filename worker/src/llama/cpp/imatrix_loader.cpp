// A C interface to llama.cpp's own importance-matrix loader
// (common/imatrix-loader.cpp, what llama-quantize --imatrix reads files with),
// so the worker quantises with exactly the data llama.cpp would load.

#include "imatrix-loader.h"

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace {

struct loaded {
    common_imatrix imatrix;
    std::vector<const std::pair<const std::string, common_imatrix_entry> *> entries;
};

}  // namespace

extern "C" {

// Loads `path` with common_imatrix_load; null when llama.cpp refuses it (its
// log says why) or on any C++ exception.
void * moe_census_imatrix_load(const char * path) {
    try {
        auto * l = new loaded();
        if (!common_imatrix_load(path, l->imatrix)) {
            delete l;
            return nullptr;
        }
        for (const auto & e : l->imatrix.entries) {
            l->entries.push_back(&e);
        }
        return l;
    } catch (...) {
        return nullptr;
    }
}

void moe_census_imatrix_free(void * handle) {
    delete static_cast<loaded *>(handle);
}

size_t moe_census_imatrix_n_entries(const void * handle) {
    return static_cast<const loaded *>(handle)->entries.size();
}

int32_t moe_census_imatrix_chunk_count(const void * handle) {
    return static_cast<const loaded *>(handle)->imatrix.chunk_count;
}

int32_t moe_census_imatrix_chunk_size(const void * handle) {
    return static_cast<const loaded *>(handle)->imatrix.chunk_size;
}

size_t moe_census_imatrix_n_datasets(const void * handle) {
    return static_cast<const loaded *>(handle)->imatrix.datasets.size();
}

const char * moe_census_imatrix_dataset(const void * handle, size_t i) {
    return static_cast<const loaded *>(handle)->imatrix.datasets[i].c_str();
}

// Entry `i` (in name order): its name and the loader's three arrays, which
// live as long as the handle.
void moe_census_imatrix_entry(
    const void * handle, size_t i,
    const char ** name,
    const float ** sums, size_t * n_sums,
    const float ** activations, size_t * n_activations,
    const int64_t ** counts, size_t * n_counts) {
    const auto * e = static_cast<const loaded *>(handle)->entries[i];
    *name = e->first.c_str();
    *sums = e->second.sums.data();
    *n_sums = e->second.sums.size();
    *activations = e->second.activations.data();
    *n_activations = e->second.activations.size();
    *counts = e->second.counts.data();
    *n_counts = e->second.counts.size();
}

}  // extern "C"
