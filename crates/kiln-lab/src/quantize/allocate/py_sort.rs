//! CPython 3.11's `list.sort` (Objects/listobject.c: runs, binary insertion, powersort merge
//! policy, galloping merges), transcribed so that inconsistent comparisons — NaN keys —
//! produce exactly Python's order. For consistent keys it is simply a stable sort.

/// `MIN_GALLOP`: the initial galloping threshold.
const MIN_GALLOP: usize = 7;

/// A pending run: `[base, base + len)`, and its powersort power.
struct Run {
    base: usize,
    len: usize,
    power: u32,
}

/// `MergeState`.
struct State<'a, T, F> {
    v: &'a mut [T],
    lt: &'a F,
    min_gallop: usize,
    pending: Vec<Run>,
    tmp: Vec<T>,
}

/// How a merge loop ended (the `goto` targets of `merge_lo` / `merge_hi`).
enum Exit {
    /// `Succeed`: copy what is left of the temp run back.
    Succeed,
    /// `CopyB` / `CopyA`: one element of the temp run is left to place.
    CopyOne,
}

/// Sorts `v` ascending by `lt` (Python's `<`), stably, exactly as `list.sort` would.
pub(crate) fn sort<T: Copy, F: Fn(&T, &T) -> bool>(v: &mut [T], lt: &F) {
    let n = v.len();
    if n < 2 {
        return;
    }
    let mut st = State {
        v,
        lt,
        min_gallop: MIN_GALLOP,
        pending: Vec::new(),
        tmp: Vec::new(),
    };
    let minrun = min_run(n);
    let mut lo = 0;
    while lo < n {
        let mut run = st.count_run(lo, n);
        if run < minrun {
            let force = (n - lo).min(minrun);
            st.binary_sort(lo, lo + force, lo + run);
            run = force;
        }
        st.found_new_run(run, n);
        st.pending.push(Run {
            base: lo,
            len: run,
            power: 0,
        });
        lo += run;
    }
    st.force_collapse();
}

/// `merge_compute_minrun`.
fn min_run(mut n: usize) -> usize {
    let mut r = 0;
    while n >= 64 {
        r |= n & 1;
        n >>= 1;
    }
    n + r
}

/// `powerloop`: the depth of the boundary between runs `[s1, s1+n1)` and the next `n2`.
fn power_loop(s1: usize, n1: usize, n2: usize, n: usize) -> u32 {
    let mut result = 0;
    let mut a = 2 * s1 + n1;
    let mut b = a + n1 + n2;
    loop {
        result += 1;
        if a >= n {
            a -= n;
            b -= n;
        } else if b >= n {
            break;
        }
        a <<= 1;
        b <<= 1;
    }
    result
}

/// `gallop_left`: where `key` goes in sorted `a`, left of equals, searching from `hint`.
fn gallop_left<T, F: Fn(&T, &T) -> bool>(key: &T, a: &[T], hint: usize, lt: &F) -> usize {
    let (mut last, mut ofs) = (0, 1);
    let (mut lo, mut hi);
    if lt(&a[hint], key) {
        let max = a.len() - hint;
        while ofs < max && lt(&a[hint + ofs], key) {
            last = ofs;
            ofs = (ofs << 1) + 1;
        }
        ofs = ofs.min(max);
        (lo, hi) = (hint + last + 1, hint + ofs);
    } else {
        let max = hint + 1;
        while ofs < max && !lt(&a[hint - ofs], key) {
            last = ofs;
            ofs = (ofs << 1) + 1;
        }
        ofs = ofs.min(max);
        (lo, hi) = (hint + 1 - ofs, hint - last);
    }
    while lo < hi {
        let m = lo + ((hi - lo) >> 1);
        if lt(&a[m], key) {
            lo = m + 1;
        } else {
            hi = m;
        }
    }
    hi
}

/// `gallop_right`: where `key` goes in sorted `a`, right of equals, searching from `hint`.
fn gallop_right<T, F: Fn(&T, &T) -> bool>(key: &T, a: &[T], hint: usize, lt: &F) -> usize {
    let (mut last, mut ofs) = (0, 1);
    let (mut lo, mut hi);
    if lt(key, &a[hint]) {
        let max = hint + 1;
        while ofs < max && lt(key, &a[hint - ofs]) {
            last = ofs;
            ofs = (ofs << 1) + 1;
        }
        ofs = ofs.min(max);
        (lo, hi) = (hint + 1 - ofs, hint - last);
    } else {
        let max = a.len() - hint;
        while ofs < max && !lt(key, &a[hint + ofs]) {
            last = ofs;
            ofs = (ofs << 1) + 1;
        }
        ofs = ofs.min(max);
        (lo, hi) = (hint + last + 1, hint + ofs);
    }
    while lo < hi {
        let m = lo + ((hi - lo) >> 1);
        if lt(key, &a[m]) {
            hi = m;
        } else {
            lo = m + 1;
        }
    }
    hi
}

impl<T: Copy, F: Fn(&T, &T) -> bool> State<'_, T, F> {
    /// `count_run`: the run starting at `lo`, reversed in place if strictly descending.
    fn count_run(&mut self, lo: usize, hi: usize) -> usize {
        if lo + 1 == hi {
            return 1;
        }
        let (v, lt) = (&mut *self.v, self.lt);
        let mut n = 2;
        if lt(&v[lo + 1], &v[lo]) {
            while lo + n < hi && lt(&v[lo + n], &v[lo + n - 1]) {
                n += 1;
            }
            v[lo..lo + n].reverse();
        } else {
            while lo + n < hi && !lt(&v[lo + n], &v[lo + n - 1]) {
                n += 1;
            }
        }
        n
    }

    /// `binarysort`: extend the sorted `[lo, start)` to `[lo, hi)` by binary insertion.
    fn binary_sort(&mut self, lo: usize, hi: usize, start: usize) {
        for s in start.max(lo + 1)..hi {
            let pivot = self.v[s];
            let (mut l, mut r) = (lo, s);
            while l < r {
                let p = l + ((r - l) >> 1);
                if (self.lt)(&pivot, &self.v[p]) {
                    r = p;
                } else {
                    l = p + 1;
                }
            }
            self.v.copy_within(l..s, l + 1);
            self.v[l] = pivot;
        }
    }

    /// `found_new_run`: merge pending runs whose power exceeds the new boundary's.
    fn found_new_run(&mut self, n2: usize, listlen: usize) {
        let Some(top) = self.pending.last() else {
            return;
        };
        let power = power_loop(top.base, top.len, n2, listlen);
        while self.pending.len() > 1 && self.pending[self.pending.len() - 2].power > power {
            self.merge_at(self.pending.len() - 2);
        }
        if let Some(top) = self.pending.last_mut() {
            top.power = power;
        }
    }

    /// `merge_force_collapse`.
    fn force_collapse(&mut self) {
        while self.pending.len() > 1 {
            let mut n = self.pending.len() - 2;
            if n > 0 && self.pending[n - 1].len < self.pending[n + 1].len {
                n -= 1;
            }
            self.merge_at(n);
        }
    }

    /// `merge_at`: merge pending runs `i` and `i + 1`.
    fn merge_at(&mut self, i: usize) {
        let (mut base_a, mut na) = (self.pending[i].base, self.pending[i].len);
        let (base_b, nb) = (self.pending[i + 1].base, self.pending[i + 1].len);
        self.pending[i].len = na + nb;
        self.pending.remove(i + 1);
        let lt = self.lt;
        let k = gallop_right(&self.v[base_b], &self.v[base_a..base_a + na], 0, lt);
        base_a += k;
        na -= k;
        if na == 0 {
            return;
        }
        let last_a = self.v[base_a + na - 1];
        let nb = gallop_left(&last_a, &self.v[base_b..base_b + nb], nb - 1, lt);
        if nb == 0 {
            return;
        }
        if na <= nb {
            self.merge_lo(base_a, na, nb);
        } else {
            self.merge_hi(base_a, na, nb);
        }
    }

    /// `merge_lo`: merge `[a, a+na)` and the `nb` after it, `a` copied out (na ≤ nb).
    fn merge_lo(&mut self, base_a: usize, na: usize, nb: usize) {
        self.tmp.clear();
        self.tmp.extend_from_slice(&self.v[base_a..base_a + na]);
        let mut c = Lo {
            dest: base_a,
            pa: 0,
            na,
            pb: base_a + na,
            nb,
        };
        match self.merge_lo_loop(&mut c) {
            Exit::Succeed => {
                let rest = &self.tmp[c.pa..c.pa + c.na];
                self.v[c.dest..c.dest + c.na].copy_from_slice(rest);
            }
            Exit::CopyOne => {
                self.v.copy_within(c.pb..c.pb + c.nb, c.dest);
                self.v[c.dest + c.nb] = self.tmp[c.pa];
            }
        }
    }

    /// The body of `merge_lo`, up to its `goto Succeed` / `goto CopyB`.
    fn merge_lo_loop(&mut self, c: &mut Lo) -> Exit {
        let lt = self.lt;
        self.take_b(c);
        if c.nb == 0 {
            return Exit::Succeed;
        }
        if c.na == 1 {
            return Exit::CopyOne;
        }
        let mut min_gallop = self.min_gallop;
        loop {
            let (mut acount, mut bcount) = (0, 0);
            loop {
                if lt(&self.v[c.pb], &self.tmp[c.pa]) {
                    self.take_b(c);
                    (acount, bcount) = (0, bcount + 1);
                    if c.nb == 0 {
                        return Exit::Succeed;
                    }
                    if bcount >= min_gallop {
                        break;
                    }
                } else {
                    self.take_a(c, 1);
                    (acount, bcount) = (acount + 1, 0);
                    if c.na == 1 {
                        return Exit::CopyOne;
                    }
                    if acount >= min_gallop {
                        break;
                    }
                }
            }
            min_gallop += 1;
            loop {
                min_gallop -= usize::from(min_gallop > 1);
                self.min_gallop = min_gallop;
                acount = gallop_right(&self.v[c.pb], &self.tmp[c.pa..c.pa + c.na], 0, lt);
                if acount > 0 {
                    self.take_a(c, acount);
                    if c.na == 1 {
                        return Exit::CopyOne;
                    }
                    if c.na == 0 {
                        return Exit::Succeed;
                    }
                }
                self.take_b(c);
                if c.nb == 0 {
                    return Exit::Succeed;
                }
                bcount = gallop_left(&self.tmp[c.pa], &self.v[c.pb..c.pb + c.nb], 0, lt);
                if bcount > 0 {
                    self.v.copy_within(c.pb..c.pb + bcount, c.dest);
                    c.dest += bcount;
                    c.pb += bcount;
                    c.nb -= bcount;
                    if c.nb == 0 {
                        return Exit::Succeed;
                    }
                }
                self.take_a(c, 1);
                if c.na == 1 {
                    return Exit::CopyOne;
                }
                if acount < MIN_GALLOP && bcount < MIN_GALLOP {
                    break;
                }
            }
            min_gallop += 1;
            self.min_gallop = min_gallop;
        }
    }

    /// One element of run b to the merge front.
    fn take_b(&mut self, c: &mut Lo) {
        self.v[c.dest] = self.v[c.pb];
        c.dest += 1;
        c.pb += 1;
        c.nb -= 1;
    }

    /// `k` elements of the copied-out run a to the merge front.
    fn take_a(&mut self, c: &mut Lo, k: usize) {
        self.v[c.dest..c.dest + k].copy_from_slice(&self.tmp[c.pa..c.pa + k]);
        c.dest += k;
        c.pa += k;
        c.na -= k;
    }

    /// `merge_hi`: merge `[a, a+na)` and the `nb` after it from the back, b copied out
    /// (na > nb). What is left of a is always `v[a..a+na]`, of b `tmp[..nb]`, and the
    /// next slot to fill `a + na + nb - 1`.
    fn merge_hi(&mut self, base_a: usize, na: usize, nb: usize) {
        self.tmp.clear();
        self.tmp
            .extend_from_slice(&self.v[base_a + na..base_a + na + nb]);
        let mut c = Hi {
            base: base_a,
            na,
            nb,
        };
        match self.merge_hi_loop(&mut c) {
            Exit::Succeed => {
                let at = c.base + c.na;
                self.v[at..at + c.nb].copy_from_slice(&self.tmp[..c.nb]);
            }
            Exit::CopyOne => {
                self.v.copy_within(c.base..c.base + c.na, c.base + 1);
                self.v[c.base] = self.tmp[0];
            }
        }
    }

    /// The body of `merge_hi`, up to its `goto Succeed` / `goto CopyA`.
    fn merge_hi_loop(&mut self, c: &mut Hi) -> Exit {
        let lt = self.lt;
        self.give_a(c, 1);
        if c.na == 0 {
            return Exit::Succeed;
        }
        if c.nb == 1 {
            return Exit::CopyOne;
        }
        let mut min_gallop = self.min_gallop;
        loop {
            let (mut acount, mut bcount) = (0, 0);
            loop {
                if lt(&self.tmp[c.nb - 1], &self.v[c.base + c.na - 1]) {
                    self.give_a(c, 1);
                    (acount, bcount) = (acount + 1, 0);
                    if c.na == 0 {
                        return Exit::Succeed;
                    }
                    if acount >= min_gallop {
                        break;
                    }
                } else {
                    self.give_b(c, 1);
                    (acount, bcount) = (0, bcount + 1);
                    if c.nb == 1 {
                        return Exit::CopyOne;
                    }
                    if bcount >= min_gallop {
                        break;
                    }
                }
            }
            min_gallop += 1;
            loop {
                min_gallop -= usize::from(min_gallop > 1);
                self.min_gallop = min_gallop;
                let run_a = &self.v[c.base..c.base + c.na];
                acount = c.na - gallop_right(&self.tmp[c.nb - 1], run_a, c.na - 1, lt);
                if acount > 0 {
                    self.give_a(c, acount);
                    if c.na == 0 {
                        return Exit::Succeed;
                    }
                }
                self.give_b(c, 1);
                if c.nb == 1 {
                    return Exit::CopyOne;
                }
                let last_a = self.v[c.base + c.na - 1];
                bcount = c.nb - gallop_left(&last_a, &self.tmp[..c.nb], c.nb - 1, lt);
                if bcount > 0 {
                    self.give_b(c, bcount);
                    if c.nb == 1 {
                        return Exit::CopyOne;
                    }
                    if c.nb == 0 {
                        return Exit::Succeed;
                    }
                }
                self.give_a(c, 1);
                if c.na == 0 {
                    return Exit::Succeed;
                }
                if acount < MIN_GALLOP && bcount < MIN_GALLOP {
                    break;
                }
            }
            min_gallop += 1;
            self.min_gallop = min_gallop;
        }
    }

    /// The last `k` elements of run a to the back of the merge.
    fn give_a(&mut self, c: &mut Hi, k: usize) {
        let src = c.base + c.na - k;
        self.v.copy_within(src..src + k, src + c.nb);
        c.na -= k;
    }

    /// The last `k` elements of the copied-out run b to the back of the merge.
    fn give_b(&mut self, c: &mut Hi, k: usize) {
        let dst = c.base + c.na + c.nb - k;
        self.v[dst..dst + k].copy_from_slice(&self.tmp[c.nb - k..c.nb]);
        c.nb -= k;
    }
}

/// `merge_lo`'s cursors: the next slot, what is left of a (in `tmp`) and of b (in `v`).
struct Lo {
    dest: usize,
    pa: usize,
    na: usize,
    pb: usize,
    nb: usize,
}

/// `merge_hi`'s state; every cursor follows from these (see `merge_hi`).
struct Hi {
    base: usize,
    na: usize,
    nb: usize,
}
