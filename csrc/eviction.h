// The built-in eviction policies' rankings, defined once: the prefix cache's policies
// (workbench/cache/policies.py, workbench/cache/s3fifo.py) call these through
// workbench._native, and the eviction lab's native replay (lab_replay.cpp) uses them
// directly, so the real cache and the lab cannot drift apart. The formulas and the
// algorithm are documented in those Python modules. Compiled without floating-point
// contraction (CMakeLists.txt): a fused multiply-add would round differently from the same
// expression evaluated step by step, and priorities must be bit-equal wherever they are
// computed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace wb::evict {

// Frecency: recency pushed forward by a hit bonus that decays with a half-life.
inline double frecency_priority(double last_used, int64_t hits, double now, double credit_s,
                                double half_life_s) {
    if (hits <= 0) return last_used;
    const double age = std::max(0.0, now - last_used);
    return last_used + credit_s * std::log2(1.0 + static_cast<double>(hits)) * std::pow(0.5, age / half_life_s);
}

// GreedyDual-Size-Frequency's value of a row: inflation + frequency * cost / size.
inline double gdsf_value(double inflation, int64_t hits, int64_t n_tokens, int64_t size_bytes) {
    const int64_t cost = std::max<int64_t>(1, n_tokens);
    const int64_t size = std::max<int64_t>(1, size_bytes);
    return inflation + static_cast<double>((hits + 1) * cost) / static_cast<double>(size);
}

// A FIFO queue of small integer keys with byte accounting (S3-FIFO's building block):
// an intrusive doubly linked list, O(1) push, pop-head, remove and move-to-tail.
class FifoList {
  public:
    int64_t capacity = -1;  // -1: unbounded
    int64_t bytes = 0;

    size_t size() const { return n_; }
    bool empty() const { return n_ == 0; }
    int32_t head() const { return head_; }
    bool contains(int32_t k) const { return k >= 0 && static_cast<size_t>(k) < in_.size() && in_[k]; }

    void push(int32_t k, int64_t size) {
        grow(k);
        in_[k] = 1;
        size_[k] = size;
        prev_[k] = tail_;
        next_[k] = -1;
        if (tail_ >= 0) next_[tail_] = k; else head_ = k;
        tail_ = k;
        bytes += size;
        ++n_;
    }

    bool remove(int32_t k) {
        if (!contains(k)) return false;
        unlink(k);
        in_[k] = 0;
        bytes -= size_[k];
        --n_;
        return true;
    }

    std::pair<int32_t, int64_t> pop_head() {
        const int32_t k = head_;
        const int64_t size = size_[k];
        remove(k);
        return {k, size};
    }

    void move_to_tail(int32_t k) {
        if (k == tail_) return;
        unlink(k);
        prev_[k] = tail_;
        next_[k] = -1;
        next_[tail_] = k;
        tail_ = k;
    }

    // Head keys for which pred holds go to the tail one by one; how many held (stops at the
    // first that does not, or when the limit-th holds, left at the head). The run of held
    // keys moves in one splice: the same order as moving them one by one.
    template <class Pred>
    size_t rotate_while(Pred pred, size_t limit) {
        size_t held = 0;
        while (n_ > 0) {
            int32_t cur = head_, last = -1;
            while (cur >= 0 && pred(cur)) {
                if (++held >= limit) {
                    splice_to_tail(last);
                    return held;
                }
                last = cur;
                cur = next_[cur];
            }
            splice_to_tail(last);
            if (cur >= 0) return held;
        }
        return held;
    }

    // FIFO-cache access: true if present; else insert, evicting from the head until it fits.
    bool admit(int32_t k, int64_t size) {
        if (contains(k)) return true;
        if (capacity >= 0) {
            if (size > capacity) return false;
            while (bytes + size > capacity) pop_head();
        }
        push(k, size);
        return false;
    }

    std::vector<int32_t> keys() const {
        std::vector<int32_t> out;
        out.reserve(n_);
        for (int32_t k = head_; k >= 0; k = next_[k]) out.push_back(k);
        return out;
    }

  private:
    std::vector<int32_t> prev_, next_;
    std::vector<int64_t> size_;
    std::vector<uint8_t> in_;
    int32_t head_ = -1, tail_ = -1;
    size_t n_ = 0;

    void grow(int32_t k) {
        if (static_cast<size_t>(k) >= in_.size()) {
            const size_t n = std::max<size_t>(static_cast<size_t>(k) + 1, in_.size() * 2);
            prev_.resize(n, -1);
            next_.resize(n, -1);
            size_.resize(n, 0);
            in_.resize(n, 0);
        }
    }

    // Move the keys from the head through `last` (-1: none) to the tail, in order.
    void splice_to_tail(int32_t last) {
        if (last < 0 || last == tail_) return;
        const int32_t first = head_;
        head_ = next_[last];
        prev_[head_] = -1;
        next_[tail_] = first;
        prev_[first] = tail_;
        next_[last] = -1;
        tail_ = last;
    }

    void unlink(int32_t k) {
        if (prev_[k] >= 0) next_[prev_[k]] = next_[k]; else head_ = next_[k];
        if (next_[k] >= 0) prev_[next_[k]] = prev_[k]; else tail_ = prev_[k];
    }
};

// S3-FIFO (Yang et al., SOSP'23) after libCacheSim's S3FIFO.c, with the KV cache's
// protected rows; the algorithm is spelled out in workbench/cache/s3fifo.py. Keys are
// small integers (the Python wrapper interns its string keys).
class S3Fifo {
  public:
    FifoList small, main, ghost;
    bool has_ghost = false;
    int64_t main_capacity = -1;
    bool has_evicted = false;

    S3Fifo(double small_ratio, double ghost_ratio, int64_t move_to_main_threshold)
        : small_ratio_(small_ratio), ghost_ratio_(ghost_ratio), threshold_(move_to_main_threshold) {}

    void set_capacity(int64_t capacity_bytes) {  // -1: unbounded
        if (capacity_bytes < 0) {
            small.capacity = -1;
            main_capacity = -1;
            has_ghost = false;
            return;
        }
        const auto small_cap = static_cast<int64_t>(static_cast<double>(capacity_bytes) * small_ratio_);
        small.capacity = small_cap;
        main_capacity = capacity_bytes - small_cap;
        const auto ghost_cap = static_cast<int64_t>(static_cast<double>(capacity_bytes) * ghost_ratio_);
        if (ghost_cap <= 0) {
            if (has_ghost) ghost = FifoList();
            has_ghost = false;
        } else {
            has_ghost = true;
            ghost.capacity = ghost_cap;
        }
    }

    bool tracked(int32_t k) const { return k >= 0 && static_cast<size_t>(k) < freq_.size() && freq_[k] >= 0; }
    int64_t freq(int32_t k) const { return tracked(k) ? freq_[k] : -1; }
    // The key still matters: queued, in the ghost, or admitted after a ghost hit.
    bool alive(int32_t k) const {
        return tracked(k) || (has_ghost && ghost.contains(k)) ||
               (k >= 0 && static_cast<size_t>(k) < ghost_hit_.size() && ghost_hit_[k]);
    }

    void on_admit(int32_t k) {
        if (has_ghost && ghost.remove(k)) flag(k) = 1;
    }

    void on_insert(int32_t k, int64_t size) {
        grow(k);
        if (freq_[k] >= 0) return;
        const int64_t small_cap = small.capacity;
        if (ghost_hit_[k]) {
            ghost_hit_[k] = 0;
            main.push(k, size);
        } else if (small_cap >= 0 && size >= small_cap) {
            main.push(k, size);
        } else if (!has_evicted && small_cap >= 0 && small.bytes >= small_cap) {
            main.push(k, size);
        } else {
            small.push(k, size);
        }
        freq_[k] = 0;
    }

    void on_hit(int32_t k) {
        if (tracked(k)) ++freq_[k];
    }

    void on_remove(int32_t k) {
        grow(k);
        ghost_hit_[k] = 0;
        if (freq_[k] >= 0) {
            freq_[k] = -1;
            if (!small.remove(k)) main.remove(k);
        }
    }

    // Choose, and stop tracking, the next key to evict; -1 when every key is protected.
    template <class Protected>
    int32_t victim(Protected is_protected) {
        has_evicted = true;
        while (!small.empty() || !main.empty()) {
            const bool main_over = main_capacity >= 0 && main.bytes > main_capacity;
            int32_t k;
            if (main_over || small.empty()) {
                k = evict_main(is_protected);
                if (k < 0) {
                    if (small.empty()) return -1;
                    k = evict_small(is_protected);
                }
            } else {
                k = evict_small(is_protected);
            }
            if (k >= 0) return k;
        }
        return -1;
    }

  private:
    double small_ratio_, ghost_ratio_;
    int64_t threshold_;
    std::vector<int64_t> freq_;       // hits since entering its queue; -1: not tracked
    std::vector<uint8_t> ghost_hit_;  // admitted after a ghost hit, not inserted yet

    uint8_t & flag(int32_t k) {
        grow(k);
        return ghost_hit_[k];
    }

    void grow(int32_t k) {
        if (static_cast<size_t>(k) >= freq_.size()) {
            const size_t n = std::max<size_t>(static_cast<size_t>(k) + 1, freq_.size() * 2);
            freq_.resize(n, -1);
            ghost_hit_.resize(n, 0);
        }
    }

    template <class Protected>
    int32_t evict_main(Protected & is_protected) {
        while (!main.empty()) {
            // protected heads go to the tail (with their freq) until an unprotected one
            if (main.rotate_while(is_protected, main.size()) >= main.size()) return -1;
            const int32_t k = main.head();
            const int64_t f = freq_[k];
            if (f >= 1) {
                main.move_to_tail(k);
                freq_[k] = std::min<int64_t>(f, 3) - 1;
            } else {
                main.remove(k);
                freq_[k] = -1;
                return k;
            }
        }
        return -1;
    }

    template <class Protected>
    int32_t evict_small(Protected & is_protected) {
        while (!small.empty()) {
            const auto [k, size] = small.pop_head();
            if (is_protected(k) || freq_[k] >= threshold_) {
                main.push(k, size);
                if (!is_protected(k)) freq_[k] = 0;
                continue;
            }
            freq_[k] = -1;
            if (has_ghost) ghost.admit(k, size);
            return k;
        }
        return -1;
    }
};

}  // namespace wb::evict
