//! `heapq.heappush` / `heappop`, step for step (Lib/heapq.py; `_heapq` does the same), so that
//! entries that compare inconsistently (NaN) come out in Python's order.

/// A binary min-heap in a list, as `heapq` keeps it.
pub(crate) struct Heap<T> {
    items: Vec<T>,
}

impl<T> Default for Heap<T> {
    fn default() -> Self {
        Heap { items: Vec::new() }
    }
}

impl<T: Copy> Heap<T> {
    /// `heappush`: append, then sift the new item towards the root.
    pub(crate) fn push(&mut self, item: T, lt: &impl Fn(&T, &T) -> bool) {
        self.items.push(item);
        let pos = self.items.len() - 1;
        self.sift_down(0, pos, lt);
    }

    /// `heappop`: the root goes, the last item takes its place and sifts.
    pub(crate) fn pop(&mut self, lt: &impl Fn(&T, &T) -> bool) -> Option<T> {
        let last = self.items.pop()?;
        if self.items.is_empty() {
            return Some(last);
        }
        let top = std::mem::replace(&mut self.items[0], last);
        self.sift_up(0, lt);
        Some(top)
    }

    /// `_siftdown`: move the item at `pos` up while it is less than its parent.
    fn sift_down(&mut self, start: usize, mut pos: usize, lt: &impl Fn(&T, &T) -> bool) {
        let item = self.items[pos];
        while pos > start {
            let parent = (pos - 1) >> 1;
            if !lt(&item, &self.items[parent]) {
                break;
            }
            self.items[pos] = self.items[parent];
            pos = parent;
        }
        self.items[pos] = item;
    }

    /// `_siftup`: walk the smaller child up to a leaf, then sift the item back.
    fn sift_up(&mut self, mut pos: usize, lt: &impl Fn(&T, &T) -> bool) {
        let (end, start, item) = (self.items.len(), pos, self.items[pos]);
        let mut child = 2 * pos + 1;
        while child < end {
            let right = child + 1;
            if right < end && !lt(&self.items[child], &self.items[right]) {
                child = right;
            }
            self.items[pos] = self.items[child];
            pos = child;
            child = 2 * pos + 1;
        }
        self.items[pos] = item;
        self.sift_down(start, pos, lt);
    }
}
