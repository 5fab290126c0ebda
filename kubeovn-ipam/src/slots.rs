//! Owner slots: one per (pod, nic), names in a shared arena, indexed by pod and by MAC.
//!
//! Slots are reused after release (with their arena region), so steady-state churn allocates nothing.

use std::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashTable};

use crate::range::Addr;
use crate::Mac;

/// "No slot".
pub(crate) const NIL: u32 = u32::MAX;
const HAS_V4: u8 = 1;
const HAS_V6: u8 = 2;
const LIVE: u8 = 4;
/// The MAC was made up during a restore because no record gave one yet; a later record may replace it.
const MAC_GUESSED: u8 = 8;
/// The pod's first nic: the slot the pod table holds.
const HEAD: u8 = 16;

/// Makes room for one more entry in a full `table` of slot ids, before hashbrown would: it rehashes every
/// entry from its slot, read in table order, which is a cache miss per entry in a big subnet. When the
/// slots are dense (`slots_len` at most twice the entries), the table is rebuilt at twice its size from
/// `entries` (every `(id, hash)` the table holds), which reads the slots in order.
pub(crate) fn make_room<I: Iterator<Item = (u32, u64)>>(
    table: &mut HashTable<u32>,
    slots_len: usize,
    entries: impl FnOnce() -> I,
) {
    let len = table.len();
    if len < table.capacity() || slots_len > 2 * len + 64 {
        return;
    }
    let mut t = HashTable::with_capacity(2 * len.max(8));
    for (id, h) in entries() {
        // The capacity is enough: the hasher is never called.
        t.insert_unique(h, id, |_| h);
    }
    if t.len() == len {
        *table = t;
    }
}

/// 32 bytes (a slot never straddles a cache line): the memory target is 100 bytes per allocated address,
/// tables included.
#[derive(Clone, Copy, Default)]
struct Slot {
    off: u32,
    v4: u32,
    next: u32,
    /// The pod name's hash (its low 32 bits): growing the pod table rehashes from here, without reading
    /// and hashing the names again.
    hash: u32,
    len: u16,
    cap: u16,
    pod_len: u16,
    mac: [u8; 6],
    flags: u8,
}

/// The pod table's hash from the 32 bits a slot keeps (`widen(h as u32) == h` for every hash it makes): the
/// low half, hashbrown's bucket, is those bits; the high half, its tag, a multiplicative mix of them.
fn widen(h: u32) -> u64 {
    u64::from(h.wrapping_mul(0x9e37_79b9)) << 32 | u64::from(h)
}

/// Every live slot but `except`, with its hash in the MAC table.
fn mac_entries<'a>(
    slots: &'a [Slot],
    hb: &'a DefaultHashBuilder,
    except: u32,
) -> impl Iterator<Item = (u32, u64)> + 'a {
    slots
        .iter()
        .enumerate()
        .filter(move |&(i, s)| s.flags & LIVE != 0 && i as u32 != except)
        .map(move |(i, s)| (i as u32, hb.hash_one(s.mac)))
}

fn name_of<'a>(slots: &[Slot], arena: &'a [u8], id: u32) -> &'a [u8] {
    let s = &slots[id as usize];
    arena
        .get(s.off as usize..s.off as usize + s.len as usize)
        .unwrap_or_default()
}

fn pod_of<'a>(slots: &[Slot], arena: &'a [u8], id: u32) -> &'a [u8] {
    let n = name_of(slots, arena, id);
    &n[..(slots[id as usize].pod_len as usize).min(n.len())]
}

pub(crate) struct Slots {
    slots: Vec<Slot>,
    /// IPv6 addresses, parallel to `slots`, grown only when a v6 address is stored.
    v6: Vec<u128>,
    arena: Vec<u8>,
    /// Arena bytes no live or free slot uses.
    waste: usize,
    free: Vec<u32>,
    /// Head slot of each pod; the pod's other nics follow through `Slot::next`.
    pods: HashTable<u32>,
    macs: HashTable<u32>,
    pub(crate) hb: DefaultHashBuilder,
    live: usize,
}

impl Default for Slots {
    fn default() -> Self {
        Slots {
            slots: Vec::new(),
            v6: Vec::new(),
            arena: Vec::new(),
            waste: 0,
            free: Vec::new(),
            pods: HashTable::new(),
            macs: HashTable::new(),
            hb: DefaultHashBuilder::default(),
            live: 0,
        }
    }
}

impl Slots {
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    pub(crate) fn pod(&self, id: u32) -> &str {
        std::str::from_utf8(pod_of(&self.slots, &self.arena, id)).unwrap_or_default()
    }

    pub(crate) fn nic(&self, id: u32) -> &str {
        let n = name_of(&self.slots, &self.arena, id);
        let p = (self.slots[id as usize].pod_len as usize).min(n.len());
        std::str::from_utf8(&n[p..]).unwrap_or_default()
    }

    pub(crate) fn owner_name(&self, id: u32) -> String {
        format!("{}/{}", self.pod(id), self.nic(id))
    }

    pub(crate) fn mac(&self, id: u32) -> Mac {
        Mac(self.slots[id as usize].mac)
    }

    pub(crate) fn v4(&self, id: u32) -> Option<u32> {
        let s = &self.slots[id as usize];
        (s.flags & HAS_V4 != 0).then_some(s.v4)
    }

    pub(crate) fn v6(&self, id: u32) -> Option<u128> {
        let s = &self.slots[id as usize];
        (s.flags & HAS_V6 != 0).then(|| self.v6.get(id as usize).copied().unwrap_or(0))
    }

    pub(crate) fn set_v4(&mut self, id: u32, a: Option<u32>) {
        let s = &mut self.slots[id as usize];
        match a {
            Some(a) => {
                s.v4 = a;
                s.flags |= HAS_V4;
            }
            None => s.flags &= !HAS_V4,
        }
    }

    pub(crate) fn set_v6(&mut self, id: u32, a: Option<u128>) {
        match a {
            Some(a) => {
                if self.v6.len() <= id as usize {
                    self.v6.resize(id as usize + 1, 0);
                }
                self.v6[id as usize] = a;
                self.slots[id as usize].flags |= HAS_V6;
            }
            None => self.slots[id as usize].flags &= !HAS_V6,
        }
    }

    /// Live slot ids, in slot order.
    pub(crate) fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.flags & LIVE != 0)
            .map(|(i, _)| i as u32)
    }

    /// Number of slots, live or free (the bound of slot ids).
    pub(crate) fn capacity_ids(&self) -> usize {
        self.slots.len()
    }

    /// The hash of a pod name in the pod table (computed once per operation).
    pub(crate) fn pod_hash(&self, pod: &str) -> u64 {
        widen(self.hb.hash_one(pod.as_bytes()) as u32)
    }

    fn head(&self, pod: &str) -> Option<u32> {
        self.head_h(pod, self.pod_hash(pod))
    }

    fn head_h(&self, pod: &str, h: u64) -> Option<u32> {
        self.pods
            .find(h, |&id| {
                pod_of(&self.slots, &self.arena, id) == pod.as_bytes()
            })
            .copied()
    }

    /// The slots of a pod's nics.
    pub(crate) fn pod_ids(&self, pod: &str) -> impl Iterator<Item = u32> + '_ {
        let mut cur = self.head(pod).unwrap_or(NIL);
        std::iter::from_fn(move || {
            (cur != NIL).then(|| {
                let id = cur;
                cur = self.slots[id as usize].next;
                id
            })
        })
    }

    pub(crate) fn find(&self, pod: &str, nic: &str) -> Option<u32> {
        self.find_h(pod, nic, self.pod_hash(pod))
    }

    /// [`Slots::find`] with the pod hash already computed.
    pub(crate) fn find_h(&self, pod: &str, nic: &str, h: u64) -> Option<u32> {
        self.find_with_head(pod, nic, h).0
    }

    /// [`Slots::find_h`], plus the pod's head slot (`NIL`: the pod has none) for [`Slots::create_at`], so a
    /// find-then-create looks the pod up once.
    pub(crate) fn find_with_head(&self, pod: &str, nic: &str, h: u64) -> (Option<u32>, u32) {
        let Some(head) = self.head_h(pod, h) else {
            return (None, NIL);
        };
        let mut cur = head;
        while cur != NIL {
            let n = name_of(&self.slots, &self.arena, cur);
            if n.get(pod.len()..) == Some(nic.as_bytes()) {
                return (Some(cur), head);
            }
            cur = self.slots[cur as usize].next;
        }
        (None, head)
    }

    /// Another slot than `me` holding `mac`.
    pub(crate) fn mac_owner(&self, mac: Mac, me: u32) -> Option<u32> {
        let h = self.hb.hash_one(mac.0);
        self.macs
            .find(h, |&id| id != me && self.slots[id as usize].mac == mac.0)
            .copied()
    }

    /// Creates a slot; the caller has validated the names (pod + nic at most `u16::MAX` bytes).
    pub(crate) fn create(&mut self, pod: &str, nic: &str, mac: Mac) -> u32 {
        self.create_h(pod, nic, mac, self.pod_hash(pod))
    }

    /// [`Slots::create`] with the pod hash already computed.
    pub(crate) fn create_h(&mut self, pod: &str, nic: &str, mac: Mac, h: u64) -> u32 {
        let head = self.head_h(pod, h).unwrap_or(NIL);
        self.create_at(pod, nic, mac, h, head)
    }

    /// [`Slots::create_h`] with the pod's head slot already looked up ([`Slots::find_with_head`]; no slot was
    /// created or removed since).
    pub(crate) fn create_at(&mut self, pod: &str, nic: &str, mac: Mac, h: u64, head: u32) -> u32 {
        let len = pod.len() + nic.len();
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.slots.push(Slot::default());
                (self.slots.len() - 1) as u32
            }
        };
        if (self.slots[id as usize].cap as usize) < len {
            self.waste += self.slots[id as usize].cap as usize;
            self.maybe_compact();
            let off = self.arena.len();
            self.arena.resize(off + len, 0);
            let s = &mut self.slots[id as usize];
            s.off = off as u32;
            s.cap = len as u16;
        }
        let off = self.slots[id as usize].off as usize;
        self.arena[off..off + pod.len()].copy_from_slice(pod.as_bytes());
        self.arena[off + pod.len()..off + len].copy_from_slice(nic.as_bytes());
        {
            let s = &mut self.slots[id as usize];
            s.len = len as u16;
            s.pod_len = pod.len() as u16;
            s.mac = mac.0;
            s.flags = LIVE;
            s.next = NIL;
            s.hash = h as u32;
        }
        let Slots {
            slots,
            pods,
            macs,
            hb,
            ..
        } = self;
        if head != NIL {
            slots[id as usize].next = slots[head as usize].next;
            slots[head as usize].next = id;
        } else {
            make_room(pods, slots.len(), || {
                slots.iter().enumerate().filter_map(|(i, s)| {
                    (s.flags & (LIVE | HEAD) == LIVE | HEAD).then_some((i as u32, widen(s.hash)))
                })
            });
            slots[id as usize].flags |= HEAD;
            pods.insert_unique(h, id, |&i| widen(slots[i as usize].hash));
        }
        make_room(macs, slots.len(), || mac_entries(slots, hb, id));
        macs.insert_unique(hb.hash_one(mac.0), id, |&i| {
            hb.hash_one(slots[i as usize].mac)
        });
        self.live += 1;
        id
    }

    /// Drops a slot; the caller has removed its addresses from the family indexes.
    pub(crate) fn remove(&mut self, id: u32) {
        let h = widen(self.slots[id as usize].hash);
        self.remove_h(id, h);
    }

    /// [`Slots::remove`] with the pod hash already computed.
    pub(crate) fn remove_h(&mut self, id: u32, h: u64) {
        let Slots {
            slots,
            arena,
            pods,
            macs,
            hb,
            ..
        } = self;
        let pod = pod_of(slots, arena, id);
        let next = slots[id as usize].next;
        if let Ok(e) = pods.find_entry(h, |&i| i == id) {
            if next == NIL {
                e.remove();
            } else {
                *e.into_mut() = next;
                slots[next as usize].flags |= HEAD;
            }
        } else {
            let mut cur = pods
                .find(h, |&i| pod_of(slots, arena, i) == pod)
                .copied()
                .unwrap_or(NIL);
            while cur != NIL {
                if slots[cur as usize].next == id {
                    slots[cur as usize].next = next;
                    break;
                }
                cur = slots[cur as usize].next;
            }
        }
        let m = slots[id as usize].mac;
        if let Ok(e) = macs.find_entry(hb.hash_one(m), |&i| i == id) {
            e.remove();
        }
        let s = &mut slots[id as usize];
        s.flags = 0;
        s.next = NIL;
        self.live -= 1;
        self.free.push(id);
    }

    pub(crate) fn mac_guessed(&self, id: u32) -> bool {
        self.slots[id as usize].flags & MAC_GUESSED != 0
    }

    pub(crate) fn set_mac_guessed(&mut self, id: u32, guessed: bool) {
        let s = &mut self.slots[id as usize];
        if guessed {
            s.flags |= MAC_GUESSED;
        } else {
            s.flags &= !MAC_GUESSED;
        }
    }

    pub(crate) fn set_mac(&mut self, id: u32, mac: Mac) {
        let Slots {
            slots, macs, hb, ..
        } = self;
        let old = slots[id as usize].mac;
        if let Ok(e) = macs.find_entry(hb.hash_one(old), |&i| i == id) {
            e.remove();
        }
        slots[id as usize].mac = mac.0;
        make_room(macs, slots.len(), || mac_entries(slots, hb, id));
        macs.insert_unique(hb.hash_one(mac.0), id, |&i| {
            hb.hash_one(slots[i as usize].mac)
        });
    }

    /// Rewrites the arena when more than half of it is dead, so churn with changing name lengths stays bounded.
    fn maybe_compact(&mut self) {
        if self.waste < 4096 || self.waste * 2 < self.arena.len() {
            return;
        }
        let mut arena = Vec::with_capacity(self.arena.len() - self.waste);
        for s in &mut self.slots {
            if s.flags & LIVE != 0 {
                let off = arena.len();
                arena.extend_from_slice(
                    &self.arena[s.off as usize..s.off as usize + s.len as usize],
                );
                s.off = off as u32;
                s.cap = s.len;
            } else {
                s.off = 0;
                s.cap = 0;
                s.len = 0;
            }
        }
        self.arena = arena;
        self.waste = 0;
    }

    /// Bytes of heap held (for the memory benchmark and tests).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.v6.capacity() * 16
            + self.arena.capacity()
            + self.free.capacity() * 4
            + self.pods.allocation_size()
            + self.macs.allocation_size()
    }
}

/// Per-family access to a slot's address.
pub(crate) trait SlotAddr: Addr {
    fn get(s: &Slots, id: u32) -> Option<Self>;
    fn set(s: &mut Slots, id: u32, a: Option<Self>);
}

impl SlotAddr for u32 {
    fn get(s: &Slots, id: u32) -> Option<Self> {
        s.v4(id)
    }
    fn set(s: &mut Slots, id: u32, a: Option<Self>) {
        s.set_v4(id, a)
    }
}

impl SlotAddr for u128 {
    fn get(s: &Slots, id: u32) -> Option<Self> {
        s.v6(id)
    }
    fn set(s: &mut Slots, id: u32, a: Option<Self>) {
        s.set_v6(id, a)
    }
}
