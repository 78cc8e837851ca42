// The eviction lab's replay of a plan through one built-in policy at one budget, natively:
// the rules of workbench/lab/chunksim.py (the chunk model of the chunked cache) and the
// request loop of workbench/lab/plan.py's run_plan, over the plan as integer arrays
// (workbench/lab/native.py builds them: chunk, row and virtual-trie node ids). The Python
// modules are the specification and the replay for any other policy; tests require the
// two to agree on every number (tests/unit/test_lab_native.py). Rankings come from
// eviction.h, which the real cache's policies use too.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "eviction.h"
#include "native.h"

namespace wb {
namespace {

using i32 = int32_t;
using i64 = int64_t;
template <class T>
using Array = py::array_t<T, py::array::c_style | py::array::forcecast>;

template <class T>
std::vector<T> to_vec(const Array<T> & a) {
    return std::vector<T>(a.data(), a.data() + a.size());
}

[[noreturn]] void bad_plan(const std::string & what) {
    throw py::value_error("native lab plan: " + what);
}

// A CSR list: items[ptr[i]:ptr[i+1]] for i < ptr.size() - 1, ids below `limit` (or -1 < id).
template <class T>
void check_csr(const char * name, const std::vector<i64> & ptr, const std::vector<T> & items, size_t n, i64 limit) {
    if (ptr.size() != n + 1 || ptr.front() != 0 || ptr.back() != static_cast<i64>(items.size()))
        bad_plan(std::string(name) + ": offsets do not match the items");
    for (size_t i = 0; i < n; ++i)
        if (ptr[i] > ptr[i + 1]) bad_plan(std::string(name) + ": offsets go backwards");
    for (const T v : items)
        if (v < 0 || v >= limit) bad_plan(std::string(name) + ": id out of range");
}

struct LabPlan {
    i64 chunk_size = 0;
    std::vector<i32> parent;  // chunk -> parent chunk, -1 for a first chunk
    std::vector<i64> tok_ptr;
    std::vector<i32> toks;    // each chunk's token ids
    std::vector<i32> depth;   // chunk -> its place in a chain (0: first)
    std::vector<i32> bucket;  // chunk -> id of (parent, first token): the chunks _pick may ask
    i32 n_buckets = 0;
    std::vector<i32> row_last;   // row -> its last chunk
    std::vector<i64> chain_ptr;
    std::vector<i32> chain;      // row -> its chunks (derived)
    std::vector<i64> row_tokens;
    std::vector<i32> node_row;   // virtual-trie node -> the row ending there, -1
    std::vector<i64> plen;
    std::vector<double> arrival;
    std::vector<i64> node_ptr;
    std::vector<i32> nodes;      // request -> trie nodes of its virtual prompt
    std::vector<i32> prompt_last;  // request -> the last chunk of its prompt's own chain, -1
    std::vector<i64> pchunk_ptr;
    std::vector<i32> pchunks;    // request -> its prompt's own chunk chain (derived)
    std::vector<i64> save_ptr;
    std::vector<i32> save_row;
    std::vector<i32> save_kind;  // 0 pin (agent prefix), 1 checkpoint, 2 prompt
    std::vector<i32> finish_row; // -1: none

    size_t n_chunks() const { return parent.size(); }
    size_t n_rows() const { return row_tokens.size(); }
    size_t n_requests() const { return plen.size(); }
    i64 ntok(i32 c) const { return tok_ptr[c + 1] - tok_ptr[c]; }
    const i32 * tok(i32 c) const { return toks.data() + tok_ptr[c]; }

    void validate() {
        const size_t C = n_chunks(), R = n_rows(), N = n_requests();
        if (chunk_size < 1) bad_plan("chunk_size must be >= 1");
        for (size_t c = 0; c < C; ++c)
            if (parent[c] < -1 || parent[c] >= static_cast<i32>(c)) bad_plan("a chunk's parent must come before it");
        if (tok_ptr.size() != C + 1 || tok_ptr.front() != 0 || tok_ptr.back() != static_cast<i64>(toks.size()))
            bad_plan("chunk tokens: offsets do not match");
        for (size_t c = 0; c < C; ++c)
            if (tok_ptr[c] >= tok_ptr[c + 1] || tok_ptr[c + 1] - tok_ptr[c] > chunk_size)
                bad_plan("a chunk holds 1..chunk_size tokens");
        if (row_last.size() != R) bad_plan("row arrays differ in length");
        for (const i32 c : row_last)
            if (c < 0 || c >= static_cast<i32>(C)) bad_plan("a row's last chunk is out of range");
        if (arrival.size() != N || finish_row.size() != N || prompt_last.size() != N)
            bad_plan("per-request arrays differ in length");
        check_csr("prompt nodes", node_ptr, nodes, N, static_cast<i64>(node_row.size()));
        for (const i32 c : prompt_last)
            if (c < -1 || c >= static_cast<i32>(C)) bad_plan("a prompt's last chunk is out of range");
        check_csr("saves", save_ptr, save_row, N, static_cast<i64>(R));
        if (save_kind.size() != save_row.size()) bad_plan("save kinds differ in length");
        for (const i32 k : save_kind)
            if (k < 0 || k > 2) bad_plan("a save kind is 0, 1 or 2");
        for (const i32 r : node_row)
            if (r < -1 || r >= static_cast<i32>(R)) bad_plan("node row out of range");
        for (const i32 r : finish_row)
            if (r < -1 || r >= static_cast<i32>(R)) bad_plan("finish row out of range");
    }

    // A CSR list of the chains ending at `last` (-1: empty), first chunk first.
    void chains(const std::vector<i32> & last, std::vector<i64> & ptr, std::vector<i32> & out) const {
        ptr.assign(1, 0);
        out.clear();
        for (const i32 l : last) {
            const size_t from = out.size();
            for (i32 c = l; c >= 0; c = parent[c]) out.push_back(c);
            std::reverse(out.begin() + static_cast<std::ptrdiff_t>(from), out.end());
            ptr.push_back(static_cast<i64>(out.size()));
        }
    }

    void derive() {  // chains, depth and (parent, first token) buckets
        chains(row_last, chain_ptr, chain);
        chains(prompt_last, pchunk_ptr, pchunks);
        const size_t C = n_chunks();
        depth.assign(C, 0);
        bucket.assign(C, 0);
        std::unordered_map<uint64_t, i32> ids;
        ids.reserve(C);
        for (size_t c = 0; c < C; ++c) {
            depth[c] = parent[c] < 0 ? 0 : depth[parent[c]] + 1;
            const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(parent[c] + 1)) << 32) |
                                 static_cast<uint32_t>(tok(static_cast<i32>(c))[0]);
            auto [it, fresh] = ids.emplace(key, n_buckets);
            if (fresh) ++n_buckets;
            bucket[c] = it->second;
        }
    }
};

enum class Policy { Lru, Lfu, Fifo, Gdsf, Frecency, S3fifo };

struct PolicyParams {
    double credit_s = 3600.0, half_life_s = 6 * 3600.0;               // frecency
    double small_ratio = 0.1, ghost_ratio = 0.9;                      // s3fifo
    i64 move_to_main_threshold = 2;
};

struct Entry {  // a leaf's rank: (protected, priority, seq), then the chunk
    bool prot;
    double prio;
    i64 seq;
    i32 key;
    bool operator>(const Entry & o) const {
        if (prot != o.prot) return prot > o.prot;
        if (prio != o.prio) return prio > o.prio;
        if (seq != o.seq) return seq > o.seq;
        return key > o.key;
    }
};

class ChunkSim {
  public:
    // counters, named as run_plan reports them
    i64 saves = 0, duplicates = 0, too_large = 0, ties = 0, evictions = 0, evicted_bytes = 0, collected = 0;
    i64 chunks_written = 0, chunks_reused = 0, logical_bytes = 0, used = 0, n_rows = 0, n_stored = 0;

    ChunkSim(const LabPlan & p, Policy policy, const PolicyParams & params, i64 budget, std::vector<i64> chunk_bytes,
             std::vector<i64> manifest_bytes, i64 bytes_per_token)
        : p_(p), policy_(policy), params_(params), budget_(budget), cbytes_(std::move(chunk_bytes)),
          mbytes_(std::move(manifest_bytes)), bpt_(bytes_per_token),
          s3_(params.small_ratio, params.ghost_ratio, params.move_to_main_threshold) {
        const size_t C = p.n_chunks(), R = p.n_rows();
        stored_.assign(C, 0);
        if (ranks()) {  // the rankings' inputs (s3fifo keeps its own state): memory only where read
            hits_.assign(C, 0);
            created_.assign(C, 0.0);
            last_hit_.assign(C, 0.0);
            has_hit_.assign(C, 0);
        }
        pinned_.assign(C, 0);
        seq_.assign(C, 0);
        rows_.resize(C);
        kids_.resize(C);
        nkids_.assign(C, 0);
        keep_.assign(C, 0);
        if (policy == Policy::Fifo) order_.assign(C, -1);
        if (policy == Policy::Gdsf) {
            h_.assign(C, 0.0);
            has_h_.assign(C, 0);
        }
        members_.resize(p.n_buckets);
        row_stored_.assign(R, 0);
        served_.resize(R);
        pos_.resize(R);
        mode_ = policy == Policy::S3fifo ? Mode::Victim : policy == Policy::Frecency ? Mode::Pure : Mode::Event;
        if (policy == Policy::S3fifo) {
            s3_.set_capacity(budget);
            s3_.reserve(static_cast<i32>(C));
        }
    }

    // The longest stored prefix of request i's prompt: its tokens, the chunks serving it.
    i64 lookup(size_t i, std::vector<i32> & out) {
        i64 best = 0;
        out.clear();
        for (i64 j = p_.node_ptr[i + 1] - 1; j >= p_.node_ptr[i]; --j) {
            const i32 r = p_.node_row[p_.nodes[j]];
            if (r >= 0 && row_stored_[r]) {
                best = p_.row_tokens[r];
                out = served_[r];
                break;
            }
        }
        const i32 * prompt = p_.pchunks.data() + p_.pchunk_ptr[i];
        const i64 len = p_.pchunk_ptr[i + 1] - p_.pchunk_ptr[i];
        i64 depth = 0, n = 0;
        while (depth < len && (p_.ntok(prompt[depth]) == p_.chunk_size || depth + 1 < len) && stored_[prompt[depth]]) {
            n += p_.ntok(prompt[depth]);
            ++depth;
        }
        chain_.assign(prompt, prompt + depth);
        if (depth < len) {
            const i32 rest = prompt[depth];
            const i32 inside = pick(p_.bucket[rest], [&](i32 k) { return agreement(k, rest); });
            if (inside >= 0) {
                chain_.push_back(inside);
                n += agreement(inside, rest);
            }
        }
        if (n && (out.empty() || n > best)) {
            best = n;
            out = chain_;
        }
        return out.empty() ? 0 : best;
    }

    void hit(const std::vector<i32> & chunks, double now) {
        for (const i32 k : chunks) {
            if (ranks()) {
                ++hits_[k];
                last_hit_[k] = now;
                has_hit_[k] = 1;
            }
            seq_[k] = tick();
            if (policy_ == Policy::Gdsf) set_h(k);
            else if (policy_ == Policy::S3fifo) s3_.on_hit(k);
            changed(k, now);
        }
    }

    void put(i32 row, double now, bool pin_it) {
        if (row_stored_[row]) {
            ++duplicates;
            if (pin_it) pin(row, now);
            return;
        }
        const i32 * chain = p_.chain.data() + p_.chain_ptr[row];
        const i64 len = p_.chain_ptr[row + 1] - p_.chain_ptr[row];
        const i64 first = missing(chain, len);
        i64 need = mbytes_[row];
        for (i64 j = first; j < len; ++j) need += cbytes_[chain[j]];
        if (need > budget_) {
            ++too_large;
            return;
        }
        ++epoch_;
        for (i64 j = 0; j < len; ++j) keep_[chain[j]] = epoch_;
        if (resolve(chain, len, first >= len - 1, served_tmp_))
            for (const i32 k : served_tmp_) keep_[k] = epoch_;
        if (policy_ == Policy::S3fifo)
            for (i64 j = first; j < len; ++j) s3_.on_admit(chain[j]);
        if (!make_room(need, now)) {
            ++too_large;
            return;
        }
        for (i64 j = first; j < len; ++j) add_chunk(chain[j], now);
        chunks_written += len - first;
        chunks_reused += first;
        add_row(row, chain, len, now);
        for (i64 j = first; j < len; ++j) absorb(chain[j], now);
        if (pin_it) pin(row, now);
        ++saves;
    }

    bool pin(i32 row, double now) {
        if (!row_stored_[row]) return false;
        const i32 old = pinned_row_ >= 0 && pinned_row_ != row ? pinned_row_ : -1;
        pinned_row_ = row;
        if (old >= 0) protect(served_[old], now);
        protect(served_[row], now);
        return true;
    }

    i64 shared_bytes() const {
        i64 total = 0;
        for (size_t c = 0; c < stored_.size(); ++c)
            if (stored_[c] && rows_[c].size() > 1) total += cbytes_[c];
        return total;
    }

  private:
    enum class Mode { Event, Pure, Victim };
    const LabPlan & p_;
    Policy policy_;
    PolicyParams params_;
    i64 budget_;
    std::vector<i64> cbytes_, mbytes_;
    i64 bpt_;
    Mode mode_;
    evict::S3Fifo s3_;

    // chunks
    std::vector<uint8_t> stored_, has_hit_, pinned_;
    std::vector<i64> hits_, seq_;
    std::vector<double> created_, last_hit_;
    std::vector<std::vector<i32>> rows_;   // the rows a chunk serves
    std::vector<std::vector<i32>> kids_;   // stored chunks continuing it
    std::vector<i32> nkids_;               // their number (read on every victim check)
    std::vector<std::vector<i32>> members_;  // bucket -> stored chunks
    std::vector<i64> keep_;                // == epoch_: held by the put making room
    i64 epoch_ = 0;
    i64 clock_ = 0;
    i64 pinned_chunks_ = 0;
    i32 pinned_row_ = -1;
    i32 evicting_ = -1;
    // rows
    std::vector<uint8_t> row_stored_;
    std::vector<std::vector<i32>> served_;  // row -> the chunks serving it (depth d at d)
    std::vector<std::vector<i32>> pos_;     // row -> its index in rows_ of each serving chunk
    // policies' own state
    std::vector<i64> order_;   // fifo: store order, -1 unknown
    i64 next_order_ = 0;
    std::vector<double> h_;    // gdsf
    std::vector<uint8_t> has_h_;
    double inflation_ = 0.0;
    // ranking
    std::vector<Entry> heap_;
    bool heap_ranked_ = false;
    double heap_now_ = 0.0;
    // scratch
    std::vector<i32> chain_, served_tmp_, stack_;

    i64 tick() { return ++clock_; }
    bool ranks() const { return policy_ != Policy::S3fifo; }  // reads hits, creation, last hit
    // S3-FIFO's rotations skip chunks with children (blocked in s3_choice) without asking.
    void leaf_changed(i32 k) {
        if (policy_ == Policy::S3fifo) s3_.set_hint(k, leaf(k));
    }
    bool leaf(i32 k) const { return nkids_[k] == 0; }
    bool full(i32 k) const { return p_.ntok(k) == p_.chunk_size; }

    i64 agreement(i32 a, i32 b) const {
        const i64 n = std::min(p_.ntok(a), p_.ntok(b));
        const i32 *x = p_.tok(a), *y = p_.tok(b);
        i64 i = 0;
        while (i < n && x[i] == y[i]) ++i;
        return i;
    }

    bool covers(i32 k, i32 t) const {  // k's tokens extend t's
        const i64 nt = p_.ntok(t);
        return p_.ntok(k) > nt && std::equal(p_.tok(t), p_.tok(t) + nt, p_.tok(k));
    }

    // The stored chunk of a bucket with the highest positive score, ties to the highest seq.
    template <class Score>
    i32 pick(i32 b, Score score) {
        i32 best = -1;
        i64 best_value = 0, best_seq = 0;
        bool tied = false;
        for (const i32 k : members_[b]) {
            const i64 value = score(k);
            if (value <= 0) continue;
            if (value == best_value) tied = true;
            else if (value > best_value) tied = false;
            if (value > best_value || (value == best_value && seq_[k] > best_seq)) {
                best = k;
                best_value = value;
                best_seq = seq_[k];
            }
        }
        ties += tied;
        return best;
    }

    i32 cover(i32 tail) {
        return pick(p_.bucket[tail], [&](i32 k) -> i64 { return covers(k, tail) ? 1 : 0; });
    }

    i64 missing(const i32 * chain, i64 len) {
        for (i64 i = 0; i < len; ++i) {
            if (!stored_[chain[i]]) {
                const bool tail = i == len - 1 && p_.ntok(chain[i]) < p_.chunk_size;
                if (tail && cover(chain[i]) >= 0) return len;
                return i;
            }
        }
        return len;
    }

    bool resolve(const i32 * chain, i64 len, bool head_stored, std::vector<i32> & out) {
        out.clear();
        if (!head_stored) return false;
        if (stored_[chain[len - 1]]) {
            out.assign(chain, chain + len);
            return true;
        }
        const i32 c = cover(chain[len - 1]);
        if (c < 0) return false;
        out.assign(chain, chain + len - 1);
        out.push_back(c);
        return true;
    }

    bool make_room(i64 need, double now) {
        while (used + need > budget_) {
            const i32 victim = next(now);
            if (victim < 0) return false;
            evict(victim, now);
        }
        return true;
    }

    void add_chunk(i32 k, double now) {
        stored_[k] = 1;
        if (ranks()) {
            hits_[k] = 0;
            created_[k] = now;
            has_hit_[k] = 0;
        }
        pinned_[k] = 0;
        seq_[k] = tick();
        rows_[k].clear();
        if (p_.parent[k] >= 0) {
            kids_[p_.parent[k]].push_back(k);
            if (++nkids_[p_.parent[k]] == 1) leaf_changed(p_.parent[k]);
        }
        leaf_changed(k);
        members_[p_.bucket[k]].push_back(k);
        used += cbytes_[k];
        ++n_stored;
        on_insert(k);
        changed(k, now);
    }

    void add_row(i32 row, const i32 * chain, i64 len, double now) {
        const bool ok = resolve(chain, len, true, served_tmp_);
        if (!ok) bad_plan("internal: a stored row's chunks are missing");
        served_[row] = served_tmp_;
        pos_[row].assign(served_tmp_.size(), 0);
        row_stored_[row] = 1;
        ++n_rows;
        used += mbytes_[row];
        logical_bytes += p_.row_tokens[row] * bpt_;
        for (size_t d = 0; d < served_tmp_.size(); ++d) {
            const i32 k = served_tmp_[d];
            pos_[row][d] = static_cast<i32>(rows_[k].size());
            rows_[k].push_back(row);
        }
        protect(served_[row], now);
    }

    void absorb(i32 key, double now) {
        if (!stored_[key]) return;
        std::vector<i32> tails;
        for (const i32 t : members_[p_.bucket[key]])
            if (t != key && !full(t) && leaf(t) && covers(key, t)) tails.push_back(t);
        for (const i32 t : tails) {
            const i32 d = p_.depth[t];
            for (const i32 r : rows_[t]) {
                pos_[r][d] = static_cast<i32>(rows_[key].size());
                rows_[key].push_back(r);
                served_[r][d] = key;
            }
            rows_[t].clear();
            protect({key}, now);
            ++collected;
            drop(t, now);
        }
    }

    bool serves_pinned(i32 k) const {
        if (pinned_row_ < 0) return false;
        const auto & s = served_[pinned_row_];
        const size_t d = static_cast<size_t>(p_.depth[k]);
        return d < s.size() && s[d] == k;
    }

    void protect(const std::vector<i32> & keys, double now) {
        if (pinned_row_ < 0 && pinned_chunks_ == 0) return;
        for (const i32 k : keys) {
            if (stored_[k] && static_cast<bool>(pinned_[k]) != serves_pinned(k)) {
                pinned_[k] = !pinned_[k];
                pinned_chunks_ += pinned_[k] ? 1 : -1;
                changed(k, now);
            }
        }
    }

    void evict(i32 key, double now) {
        const i64 before = used;
        ++evictions;
        on_evict(key);
        on_remove(key);
        evicting_ = key;
        drop(key, now);
        evicting_ = -1;
        evicted_bytes += before - used;
    }

    void drop(i32 key, double now) {
        if (!stored_[key]) return;
        // over copies of its children and rows (dropping changes both), on a shared stack
        const size_t base = stack_.size();
        stack_.insert(stack_.end(), kids_[key].begin(), kids_[key].end());
        for (size_t i = base, end = stack_.size(); i < end; ++i) drop(stack_[i], now);
        stack_.resize(base);
        stack_.insert(stack_.end(), rows_[key].begin(), rows_[key].end());
        for (size_t i = base, end = stack_.size(); i < end; ++i) remove_row(stack_[i], now);
        stack_.resize(base);
        if (!stored_[key]) return;  // removing its rows dropped it as an unnamed tail
        stored_[key] = 0;
        pinned_chunks_ -= pinned_[key];
        const i32 parent = p_.parent[key];
        if (parent >= 0) {
            erase(kids_[parent], key);
            if (--nkids_[parent] == 0) leaf_changed(parent);
        }
        erase(members_[p_.bucket[key]], key);
        --n_stored;
        if (key != evicting_) on_remove(key);
        used -= cbytes_[key];
        if (parent >= 0 && leaf(parent)) changed(parent, now);
    }

    static void erase(std::vector<i32> & v, i32 k) {
        auto it = std::find(v.begin(), v.end(), k);
        *it = v.back();
        v.pop_back();
    }

    void remove_row(i32 r, double now) {
        row_stored_[r] = 0;
        --n_rows;
        const std::vector<i32> & served = served_[r];  // not changed until the row is stored again
        for (size_t d = 0; d < served.size(); ++d) {
            const i32 k = served[d];
            if (!stored_[k]) continue;
            auto & list = rows_[k];
            const i32 at = pos_[r][d];
            const i32 moved = list.back();
            list[at] = moved;
            pos_[moved][d] = at;
            list.pop_back();
        }
        if (pinned_row_ == r) {
            pinned_row_ = -1;
            protect(served, now);
        }
        used -= mbytes_[r];
        logical_bytes -= p_.row_tokens[r] * bpt_;
        const i32 tail = served.back();
        if (stored_[tail] && !full(tail) && rows_[tail].empty() && leaf(tail)) {
            if (tail != evicting_) ++collected;
            drop(tail, now);
        }
    }

    // -- the policy ----------------------------------------------------------------------
    void set_h(i32 k) {
        h_[k] = evict::gdsf_value(inflation_, hits_[k], p_.ntok(k), cbytes_[k]);
        has_h_[k] = 1;
    }

    void on_insert(i32 k) {
        switch (policy_) {
            case Policy::Fifo: order_[k] = next_order_++; break;
            case Policy::Gdsf: set_h(k); break;
            case Policy::S3fifo: s3_.on_insert(k, cbytes_[k]); break;
            default: break;
        }
    }

    void on_evict(i32 k) {
        if (policy_ == Policy::Gdsf) inflation_ = std::max(inflation_, has_h_[k] ? h_[k] : inflation_);
    }

    void on_remove(i32 k) {
        switch (policy_) {
            case Policy::Fifo: order_[k] = -1; break;
            case Policy::Gdsf: has_h_[k] = 0; break;
            case Policy::S3fifo: s3_.on_remove(k); break;
            default: break;
        }
    }

    double last_used(i32 k) const { return has_hit_[k] ? last_hit_[k] : created_[k]; }

    double priority(i32 k, double now) const {
        switch (policy_) {
            case Policy::Lru: return last_used(k);
            case Policy::Lfu: return static_cast<double>(hits_[k]);
            case Policy::Fifo: return static_cast<double>(order_[k]);
            case Policy::Gdsf:
                return has_h_[k] ? h_[k] : evict::gdsf_value(inflation_, hits_[k], p_.ntok(k), cbytes_[k]);
            case Policy::Frecency:
                return evict::frecency_priority(last_used(k), hits_[k], now, params_.credit_s, params_.half_life_s);
            case Policy::S3fifo: break;
        }
        return 0.0;
    }

    Entry entry(i32 k, double now) const { return {static_cast<bool>(pinned_[k]), priority(k, now), seq_[k], k}; }

    void changed(i32 k, double now) {
        if (mode_ == Mode::Event || (mode_ == Mode::Pure && heap_ranked_ && now == heap_now_)) {
            if (leaf(k)) {
                heap_.push_back(entry(k, now));
                std::push_heap(heap_.begin(), heap_.end(), std::greater<Entry>());
                if (heap_.size() > 4 * static_cast<size_t>(n_stored) + 1024) rank(now);
            }
        }
    }

    void rank(double now) {
        heap_.clear();
        for (size_t c = 0; c < stored_.size(); ++c)
            if (stored_[c] && leaf(static_cast<i32>(c))) heap_.push_back(entry(static_cast<i32>(c), now));
        std::make_heap(heap_.begin(), heap_.end(), std::greater<Entry>());
        heap_ranked_ = true;
        heap_now_ = now;
    }

    bool valid(const Entry & e) const {
        return stored_[e.key] && seq_[e.key] == e.seq && static_cast<bool>(pinned_[e.key]) == e.prot && leaf(e.key);
    }

    i32 next(double now) {
        if (mode_ == Mode::Victim) return s3_choice();
        if (mode_ == Mode::Pure && !(heap_ranked_ && now == heap_now_)) rank(now);
        std::vector<Entry> kept;
        i32 found = -1;
        while (!heap_.empty()) {
            std::pop_heap(heap_.begin(), heap_.end(), std::greater<Entry>());
            const Entry e = heap_.back();
            heap_.pop_back();
            if (!valid(e)) continue;
            if (keep_[e.key] == epoch_) {
                kept.push_back(e);
                continue;
            }
            found = e.key;
            break;
        }
        for (const Entry & e : kept) {
            heap_.push_back(e);
            std::push_heap(heap_.begin(), heap_.end(), std::greater<Entry>());
        }
        return found;
    }

    // A chunk with children is blocked (its hint is 0 in s3_: leaf_changed).
    i32 s3_choice() {
        auto blocked = [&](i32 k) { return !stored_[k] || !leaf(k) || keep_[k] == epoch_; };
        auto blocked_or_protected = [&](i32 k) { return blocked(k) || pinned_[k]; };
        i32 picked = s3_.victim(blocked_or_protected);
        if (picked < 0) picked = s3_.victim(blocked);
        return picked >= 0 && !blocked(picked) ? picked : -1;
    }
};

Policy policy_of(const std::string & name) {
    if (name == "lru") return Policy::Lru;
    if (name == "lfu") return Policy::Lfu;
    if (name == "fifo") return Policy::Fifo;
    if (name == "gdsf") return Policy::Gdsf;
    if (name == "frecency") return Policy::Frecency;
    if (name == "s3fifo") return Policy::S3fifo;
    throw py::value_error("native lab replay: no built-in policy named '" + name + "'");
}

// run_plan's loop (plan.py), natively.
py::dict replay(const LabPlan & plan, const std::string & name, const py::dict & params, i64 budget,
                const Array<i64> & chunk_bytes, const Array<i64> & manifest_bytes, i64 bytes_per_token,
                i64 timeline_every, bool record) {
    PolicyParams pp;
    if (params.contains("credit_s")) pp.credit_s = params["credit_s"].cast<double>();
    if (params.contains("half_life_s")) pp.half_life_s = params["half_life_s"].cast<double>();
    if (params.contains("small_ratio")) pp.small_ratio = params["small_ratio"].cast<double>();
    if (params.contains("ghost_ratio")) pp.ghost_ratio = params["ghost_ratio"].cast<double>();
    if (params.contains("move_to_main_threshold")) pp.move_to_main_threshold = params["move_to_main_threshold"].cast<i64>();
    if (!std::isfinite(pp.credit_s) || !(pp.half_life_s > 0.0) || !std::isfinite(pp.half_life_s))
        throw py::value_error("native lab replay: frecency needs a finite credit_s and a finite half_life_s > 0");
    if (static_cast<size_t>(chunk_bytes.size()) != plan.n_chunks() || static_cast<size_t>(manifest_bytes.size()) != plan.n_rows())
        bad_plan("chunk or manifest sizes differ from the plan");
    const Policy policy = policy_of(name);
    const size_t N = plan.n_requests();
    std::vector<i64> kinds, starts;
    py::list timeline;
    i64 exact = 0, partial = 0, misses = 0, saved = 0, matched_total = 0;
    {
        py::gil_scoped_release nogil;
        ChunkSim sim(plan, policy, pp, budget, to_vec(chunk_bytes), to_vec(manifest_bytes), bytes_per_token);
        std::vector<i32> match;
        std::vector<std::array<double, 7>> points;
        for (size_t i = 0; i < N; ++i) {
            const double now = plan.arrival[i];
            const i64 plen = plan.plen[i];
            i64 matched = 0;
            if (plen > 1) matched = sim.lookup(i, match);
            if (matched <= 0) {
                matched = 0;
                ++misses;
            } else {
                sim.hit(match, now);
            }
            const int kind = matched <= 0 ? 0 : matched >= plen - 1 ? 1 : 2;  // cold, exact, partial
            exact += kind == 1;
            partial += kind == 2;
            const i64 start = std::min(matched, plen - 1);
            matched_total += matched;
            saved += start;
            for (i64 j = plan.save_ptr[i]; j < plan.save_ptr[i + 1]; ++j) {
                const i32 row = plan.save_row[j];
                const i64 n_tok = plan.row_tokens[row];
                if (plan.save_kind[j] == 0) {
                    if (n_tok > start) sim.put(row, now, true);
                    else sim.pin(row, now);
                } else if (n_tok > start) {
                    sim.put(row, now, false);
                }
            }
            if (plan.finish_row[i] >= 0) sim.put(plan.finish_row[i], now, false);
            if (record) {
                kinds.push_back(kind);
                starts.push_back(start);
            }
            if (timeline_every > 0 && ((i + 1) % static_cast<size_t>(timeline_every) == 0 || i + 1 == N))
                points.push_back({static_cast<double>(i + 1), now, static_cast<double>(sim.used),
                                  static_cast<double>(sim.n_rows), static_cast<double>(sim.evictions),
                                  static_cast<double>(exact + partial), static_cast<double>(misses)});
        }
        py::gil_scoped_acquire gil;
        for (const auto & q : points)
            timeline.append(py::make_tuple(static_cast<i64>(q[0]), q[1], static_cast<i64>(q[2]), static_cast<i64>(q[3]),
                                           static_cast<i64>(q[4]), static_cast<i64>(q[5]), static_cast<i64>(q[6])));
        py::dict out;
        out["exact_hits"] = exact;
        out["partial_hits"] = partial;
        out["misses"] = misses;
        out["prefill_tokens_saved"] = saved;
        out["matched_tokens"] = matched_total;
        out["rows_saved"] = sim.saves;
        out["saves_too_large"] = sim.too_large;
        out["evictions"] = sim.evictions;
        out["evicted_bytes"] = sim.evicted_bytes;
        out["rows_end"] = sim.n_rows;
        out["bytes_end"] = sim.used;
        out["chunks_end"] = sim.n_stored;
        out["logical_bytes_end"] = sim.logical_bytes;
        out["shared_bytes_end"] = sim.shared_bytes();
        out["chunks_written"] = sim.chunks_written;
        out["chunks_reused"] = sim.chunks_reused;
        out["chunks_collected"] = sim.collected;
        out["chunk_ties"] = sim.ties;
        out["timeline"] = timeline;
        out["kinds"] = py::cast(kinds);
        out["starts"] = py::cast(starts);
        return out;
    }
}

}  // namespace

void bind_lab(py::module_ & m) {
    auto lab = m.def_submodule("lab", "The eviction lab's native replay (workbench/lab/native.py)");
    py::class_<LabPlan>(lab, "Plan")
        .def(py::init([](i64 chunk_size, const Array<i32> & parent, const Array<i64> & tok_ptr, const Array<i32> & toks,
                         const Array<i32> & row_last, const Array<i64> & row_tokens,
                         const Array<i32> & node_row, const Array<i64> & plen, const Array<double> & arrival,
                         const Array<i64> & node_ptr, const Array<i32> & nodes, const Array<i32> & prompt_last,
                         const Array<i64> & save_ptr, const Array<i32> & save_row,
                         const Array<i32> & save_kind, const Array<i32> & finish_row) {
                 LabPlan p;
                 p.chunk_size = chunk_size;
                 p.parent = to_vec(parent);
                 p.tok_ptr = to_vec(tok_ptr);
                 p.toks = to_vec(toks);
                 p.row_last = to_vec(row_last);
                 p.row_tokens = to_vec(row_tokens);
                 p.node_row = to_vec(node_row);
                 p.plen = to_vec(plen);
                 p.arrival = to_vec(arrival);
                 p.node_ptr = to_vec(node_ptr);
                 p.nodes = to_vec(nodes);
                 p.prompt_last = to_vec(prompt_last);
                 p.save_ptr = to_vec(save_ptr);
                 p.save_row = to_vec(save_row);
                 p.save_kind = to_vec(save_kind);
                 p.finish_row = to_vec(finish_row);
                 p.validate();
                 p.derive();
                 return p;
             }),
             py::kw_only(), py::arg("chunk_size"), py::arg("parent"), py::arg("tok_ptr"), py::arg("toks"),
             py::arg("row_last"), py::arg("row_tokens"), py::arg("node_row"), py::arg("plen"),
             py::arg("arrival"), py::arg("node_ptr"), py::arg("nodes"), py::arg("prompt_last"),
             py::arg("save_ptr"), py::arg("save_row"), py::arg("save_kind"), py::arg("finish_row"))
        .def("row_chain_lengths", [](const LabPlan & p) {
            py::array_t<i64> out(static_cast<py::ssize_t>(p.n_rows()));
            auto w = out.mutable_unchecked<1>();
            for (size_t r = 0; r < p.n_rows(); ++r) w(static_cast<py::ssize_t>(r)) = p.chain_ptr[r + 1] - p.chain_ptr[r];
            return out;
        })
        .def_property_readonly("n_chunks", &LabPlan::n_chunks)
        .def_property_readonly("n_rows", &LabPlan::n_rows)
        .def_property_readonly("n_requests", &LabPlan::n_requests);
    lab.def("replay", &replay, py::arg("plan"), py::arg("policy"), py::arg("params"), py::arg("budget"),
            py::arg("chunk_bytes"), py::arg("manifest_bytes"), py::arg("bytes_per_token"), py::arg("timeline_every"),
            py::arg("record"));
}

}  // namespace wb
