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
#include <limits>
#include <stdexcept>
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
// (S3-FIFO's small queue and ghost; its main queue is a ClockList.)
class FifoList {
  public:
    int64_t capacity = -1;  // -1: unbounded
    int64_t bytes = 0;

    size_t size() const { return n_; }
    bool empty() const { return n_ == 0; }
    int32_t head() const { return head_; }
    bool contains(int32_t k) const { return k >= 0 && static_cast<size_t>(k) < in_.size() && in_[k]; }
    void reserve(int32_t n_keys) {  // room for keys below n_keys, made at once
        if (n_keys > 0) grow(n_keys - 1);
    }

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

    void unlink(int32_t k) {
        if (prev_[k] >= 0) next_[prev_[k]] = next_[k]; else head_ = next_[k];
        if (next_[k] >= 0) prev_[next_[k]] = prev_[k]; else tail_ = prev_[k];
    }
};

// S3-FIFO's main queue: a FIFO queue of small integer keys with byte accounting, kept as a
// cycle with a moving head. Moving the head key to the tail is moving the head one key on
// (the order of the keys, read from the head, is the same as a FIFO queue's), and pushing at
// the tail is inserting just before the head. The cycle is a ring of blocks of up to 64
// slots, each with a mask of the slots holding keys and a mask of "hints": a key whose hint
// is 0 is one the caller guarantees the rotation's predicate holds for (the eviction lab
// keeps it 0 for chunks with children, which can never be victims), so a rotation skips
// runs of such keys 64 at a time instead of visiting them. Hints are 1 unless set; with all
// hints 1 every key is visited, in the same order.
class ClockList {
  public:
    int64_t bytes = 0;

    size_t size() const { return n_; }
    bool empty() const { return n_ == 0; }
    int32_t head() const { return n_ > 0 ? blocks_[hb_].keys[hs_] : -1; }
    bool contains(int32_t k) const { return k >= 0 && static_cast<size_t>(k) < pos_.size() && pos_[k] >= 0; }
    void reserve(int32_t n_keys) {  // room for keys below n_keys, made at once
        if (n_keys > 0) grow(n_keys - 1);
    }

    // The caller's promise about k from now on: hint 0 means the rotation's predicate holds.
    void set_hint(int32_t k, bool hint) {
        grow(k);
        hint_[k] = hint;
        if (pos_[k] >= 0) {
            Block & b = blocks_[pos_[k] >> 6];
            const uint64_t bit = uint64_t{1} << (pos_[k] & 63);
            b.hint = hint ? (b.hint | bit) : (b.hint & ~bit);
        }
    }

    // At the tail: just before the head.
    void push(int32_t k, int64_t size) {
        grow(k);
        size_[k] = size;
        bytes += size;
        if (n_++ == 0) {
            const int32_t b = new_block();
            blocks_[b].prev = blocks_[b].next = b;
            hb_ = b;
            hs_ = 0;
            put(b, k);
            return;
        }
        if (blocks_[hb_].live & low(hs_)) split_at_head();
        int32_t t = blocks_[hb_].prev;  // the tail block (the head block itself when alone)
        if (blocks_[t].fill >= 64) {
            const int32_t b = new_block();
            link_before(b, hb_);
            t = b;
        }
        put(t, k);
    }

    bool remove(int32_t k) {
        if (!contains(k)) return false;
        const int32_t at = pos_[k];
        const int32_t b = at >> 6, slot = at & 63;
        pos_[k] = -1;
        bytes -= size_[k];
        blocks_[b].live &= ~(uint64_t{1} << slot);
        blocks_[b].hint &= ~(uint64_t{1} << slot);
        if (--n_ == 0) {
            blocks_.clear();
            free_.clear();
            hb_ = -1;
            hs_ = 0;
            return true;
        }
        if (b == hb_ && slot == hs_) step();
        if (blocks_[b].live == 0) {
            blocks_[blocks_[b].prev].next = blocks_[b].next;
            blocks_[blocks_[b].next].prev = blocks_[b].prev;
            free_.push_back(b);
        }
        return true;
    }

    // The head key goes to the tail: the next key becomes the head.
    void advance_head() {
        if (n_ > 1) step();
    }

    // Head keys for which pred holds go to the tail one by one, skipping (not asking pred
    // about) keys with hint 0. False if it held for every key: then the last key is left at
    // the head, as a FIFO queue rotated one key short of a full turn leaves it.
    template <class Pred>
    bool rotate_while(Pred pred) {
        if (n_ == 0) return true;
        size_t held = 0;
        int32_t b = hb_;
        uint64_t m = blocks_[b].live & ~low(hs_);
        for (;;) {
            const Block & blk = blocks_[b];
            uint64_t cand = m & blk.hint;
            while (cand) {
                const int j = __builtin_ctzll(cand);
                const uint64_t below = m & low(j);
                if (held + static_cast<size_t>(__builtin_popcountll(below)) >= n_) return stop_all(b, m, held);
                held += static_cast<size_t>(__builtin_popcountll(below));
                m &= ~low(j);
                if (!pred(blk.keys[j])) {
                    hb_ = b;
                    hs_ = j;
                    return true;
                }
                if (++held >= n_) {
                    hb_ = b;
                    hs_ = j;
                    return false;
                }
                m &= ~(uint64_t{1} << j);
                cand = m & blk.hint;
            }
            if (held + static_cast<size_t>(__builtin_popcountll(m)) >= n_) return stop_all(b, m, held);
            held += static_cast<size_t>(__builtin_popcountll(m));
            b = blk.next;
            m = blocks_[b].live;
        }
    }

    std::vector<int32_t> keys() const {
        std::vector<int32_t> out;
        out.reserve(n_);
        if (n_ == 0) return out;
        int32_t b = hb_;
        uint64_t m = blocks_[b].live & ~low(hs_);
        for (;;) {
            for (; m; m &= m - 1) out.push_back(blocks_[b].keys[__builtin_ctzll(m)]);
            if (out.size() >= n_) return out;
            b = blocks_[b].next;
            m = blocks_[b].live;
            if (b == hb_) m &= low(hs_);
        }
    }

  private:
    struct Block {
        uint64_t live = 0, hint = 0;  // slots holding keys; of those, keys with hint 1
        int32_t prev = -1, next = -1;
        int32_t fill = 0;             // slots used so far (keys are only appended)
        int32_t keys[64];
    };
    std::vector<Block> blocks_;
    std::vector<int32_t> free_;
    std::vector<int32_t> pos_;   // key -> block * 64 + slot; -1: not queued
    std::vector<int64_t> size_;
    std::vector<uint8_t> hint_;  // key -> its hint (kept while not queued)
    int32_t hb_ = -1, hs_ = 0;   // the head: block and slot
    size_t n_ = 0;

    static uint64_t low(int s) { return s >= 64 ? ~uint64_t{0} : (uint64_t{1} << s) - 1; }

    void grow(int32_t k) {
        if (static_cast<size_t>(k) >= pos_.size()) {
            const size_t n = std::max<size_t>(static_cast<size_t>(k) + 1, pos_.size() * 2);
            pos_.resize(n, -1);
            size_.resize(n, 0);
            hint_.resize(n, 1);
        }
    }

    int32_t new_block() {
        int32_t b;
        if (!free_.empty()) {
            b = free_.back();
            free_.pop_back();
            blocks_[b] = Block();
        } else {
            b = static_cast<int32_t>(blocks_.size());
            blocks_.emplace_back();
        }
        return b;
    }

    void link_before(int32_t b, int32_t at) {
        const int32_t p = blocks_[at].prev;
        blocks_[b].prev = p;
        blocks_[b].next = at;
        blocks_[p].next = b;
        blocks_[at].prev = b;
    }

    void put(int32_t b, int32_t k) {
        Block & blk = blocks_[b];
        const int slot = blk.fill++;
        blk.keys[slot] = k;
        blk.live |= uint64_t{1} << slot;
        if (hint_[k]) blk.hint |= uint64_t{1} << slot;
        pos_[k] = b * 64 + slot;
    }

    // The head moves to the next key in the cycle (n_ >= 1 keys left).
    void step() {
        uint64_t m = blocks_[hb_].live & ~low(hs_ + 1);
        while (m == 0) {
            hb_ = blocks_[hb_].next;
            m = blocks_[hb_].live;
        }
        hs_ = __builtin_ctzll(m);
    }

    // Every key held: the head is the key before it (the last of the turn, in block b's
    // mask m, after `held` keys).
    bool stop_all(int32_t b, uint64_t m, size_t held) {
        for (; held + 1 < n_; ++held) m &= m - 1;
        hb_ = b;
        hs_ = __builtin_ctzll(m);
        return false;
    }

    // Keys precede the head in its block: move the smaller side to a block of its own, so
    // that the head starts its block and the tail is the block before it.
    void split_at_head() {
        const int32_t h = hb_;
        const uint64_t before = blocks_[h].live & low(hs_), after = blocks_[h].live & ~low(hs_);
        const int32_t b = new_block();  // may move blocks_: index, no references, until here
        if (__builtin_popcountll(before) <= __builtin_popcountll(after)) {
            link_before(b, h);
            move_keys(h, before, b);
        } else {
            link_before(b, blocks_[h].next);
            move_keys(h, after, b);
            blocks_[h].fill = hs_;
            hb_ = b;
            hs_ = 0;
        }
    }

    void move_keys(int32_t from, uint64_t m, int32_t to) {
        for (uint64_t r = m; r; r &= r - 1) put(to, blocks_[from].keys[__builtin_ctzll(r)]);
        blocks_[from].live &= ~m;
        blocks_[from].hint &= ~m;
    }
};

// S3-FIFO (Yang et al., SOSP'23) after libCacheSim's S3FIFO.c, with the KV cache's
// protected rows; the algorithm is spelled out in workbench/cache/s3fifo.py. Keys are
// small integers (the Python wrapper interns its string keys).
class S3Fifo {
  public:
    FifoList small, ghost;
    ClockList main;
    bool has_ghost = false;
    int64_t main_capacity = -1;
    bool has_evicted = false;

    // small_ratio in (0, 1); ghost_ratio finite, at most 1000 (<= 0: no ghost); threshold >= 1.
    S3Fifo(double small_ratio, double ghost_ratio, int64_t move_to_main_threshold)
        : small_ratio_(small_ratio), ghost_ratio_(ghost_ratio), threshold_(move_to_main_threshold) {
        if (!(small_ratio > 0.0 && small_ratio < 1.0)) throw std::invalid_argument("small_ratio must be in (0, 1)");
        if (!std::isfinite(ghost_ratio) || ghost_ratio > 1000.0)
            throw std::invalid_argument("ghost_ratio must be finite and at most 1000");
        if (move_to_main_threshold < 1) throw std::invalid_argument("move_to_main_threshold must be >= 1");
    }

    // Room for keys below n_keys, made at once rather than grown by doubling as keys come.
    void reserve(int32_t n_keys) {
        if (n_keys <= 0) return;
        grow(n_keys - 1);
        small.reserve(n_keys);
        main.reserve(n_keys);
        ghost.reserve(n_keys);
    }

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
        const double ghost_bytes = static_cast<double>(capacity_bytes) * ghost_ratio_;  // at most 1000x
        const auto ghost_cap = ghost_bytes >= 9.2e18 ? std::numeric_limits<int64_t>::max()
                                                     : static_cast<int64_t>(ghost_bytes);
        if (ghost_cap <= 0) {
            if (has_ghost) ghost = FifoList();
            has_ghost = false;
        } else {
            has_ghost = true;
            ghost.capacity = ghost_cap;
        }
    }

    bool tracked(int32_t k) const { return k >= 0 && static_cast<size_t>(k) < freq_.size() && freq_[k] >= 0; }
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

    // The caller's promise for the main queue's rotations (ClockList::set_hint): hint false
    // means every predicate `victim` is given holds for k (k is skipped, never a victim).
    void set_hint(int32_t k, bool hint) { main.set_hint(k, hint); }

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
            if (!main.rotate_while(is_protected)) return -1;
            const int32_t k = main.head();
            const int64_t f = freq_[k];
            if (f >= 1) {
                main.advance_head();
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
