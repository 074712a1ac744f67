//! Ordered maps and sets that are usually tiny: a semaphore's holders and waiters (most
//! semaphores have one or two), and what a lease holds and waits for (usually one object).
//!
//! A `BTreeMap` allocates a whole node (room for 11 entries) for its first entry: for a holder
//! that is about 800 bytes, kept per semaphore, on every node. These types keep up to
//! [`FEW`] entries in a sorted vector sized to its contents and move to a `BTreeMap` past that,
//! so a large queue keeps its O(log n) cost. They behave as the `BTreeMap`/`BTreeSet` they
//! replace (same order, same lookups) and serialize exactly as one: a map (or a sequence, for
//! the set) of the entries in key order, so snapshots and the state hash do not change.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::collections::btree_map;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The most entries kept in the vector; one more moves them to a tree.
const FEW: usize = 8;

/// An ordered map, as `BTreeMap`, that keeps up to [`FEW`] entries in a sorted vector.
#[derive(Clone)]
pub(crate) enum SmallMap<K, V> {
    /// Sorted by key, at most [`FEW`] entries, capacity equal to the length after an insert.
    Few(Vec<(K, V)>),
    /// Boxed on purpose (one more allocation for a large map): the map stays as small as the
    /// vector, which every semaphore keeps four of.
    #[allow(clippy::box_collection)]
    Many(Box<BTreeMap<K, V>>),
}

impl<K, V> Default for SmallMap<K, V> {
    fn default() -> Self {
        SmallMap::Few(Vec::new())
    }
}

impl<K: Ord, V> SmallMap<K, V> {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            SmallMap::Few(v) => v.len(),
            SmallMap::Many(m) => m.len(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        match self {
            SmallMap::Few(v) => find(v, key).ok().map(|i| &v[i].1),
            SmallMap::Many(m) => m.get(key),
        }
    }

    pub(crate) fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        match self {
            SmallMap::Few(v) => match find(v, key) {
                Ok(i) => Some(&mut v[i].1),
                Err(_) => None,
            },
            SmallMap::Many(m) => m.get_mut(key),
        }
    }

    pub(crate) fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.get(key).is_some()
    }

    /// Inserts `value` under `key`; returns the value it replaced.
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self {
            SmallMap::Few(v) => match find(v, &key) {
                Ok(i) => Some(std::mem::replace(&mut v[i].1, value)),
                Err(i) if v.len() < FEW => {
                    // Grow by exactly one: a vector's first push would make room for four.
                    v.reserve_exact(1);
                    v.insert(i, (key, value));
                    None
                }
                Err(_) => {
                    let mut m: BTreeMap<K, V> = std::mem::take(v).into_iter().collect();
                    m.insert(key, value);
                    *self = SmallMap::Many(Box::new(m));
                    None
                }
            },
            SmallMap::Many(m) => m.insert(key, value),
        }
    }

    /// Removes `key`; returns its value.
    pub(crate) fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        match self {
            SmallMap::Few(v) => {
                let i = find(v, key).ok()?;
                let (_, value) = v.remove(i);
                if v.is_empty() {
                    *v = Vec::new();
                }
                Some(value)
            }
            SmallMap::Many(m) => {
                let value = m.remove(key)?;
                // A tree emptied keeps its root node; an empty map keeps nothing.
                if m.is_empty() {
                    *self = SmallMap::Few(Vec::new());
                }
                Some(value)
            }
        }
    }

    pub(crate) fn clear(&mut self) {
        *self = SmallMap::Few(Vec::new());
    }

    pub(crate) fn first_key_value(&self) -> Option<(&K, &V)> {
        match self {
            SmallMap::Few(v) => v.first().map(|(k, v)| (k, v)),
            SmallMap::Many(m) => m.first_key_value(),
        }
    }

    /// The entries in key order.
    pub(crate) fn iter(&self) -> Iter<'_, K, V> {
        match self {
            SmallMap::Few(v) => Iter::Few(v.iter()),
            SmallMap::Many(m) => Iter::Many(m.range::<K, _>(..)),
        }
    }

    /// The entries whose keys are in `range`, in key order. Panics where `BTreeMap::range`
    /// does (a range that ends before it starts).
    pub(crate) fn range<R: RangeBounds<K>>(&self, range: R) -> Iter<'_, K, V> {
        match self {
            SmallMap::Few(v) => {
                let start = match range.start_bound() {
                    Bound::Included(s) => v.partition_point(|(k, _)| k < s),
                    Bound::Excluded(s) => v.partition_point(|(k, _)| k <= s),
                    Bound::Unbounded => 0,
                };
                let end = match range.end_bound() {
                    Bound::Included(e) => v.partition_point(|(k, _)| k <= e),
                    Bound::Excluded(e) => v.partition_point(|(k, _)| k < e),
                    Bound::Unbounded => v.len(),
                };
                Iter::Few(v[start..end.max(start)].iter())
            }
            SmallMap::Many(m) => Iter::Many(m.range(range)),
        }
    }

    pub(crate) fn keys(&self) -> impl DoubleEndedIterator<Item = &K> {
        self.iter().map(|(k, _)| k)
    }

    pub(crate) fn values(&self) -> impl DoubleEndedIterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }
}

/// The index of `key` in the sorted `entries`, or where it would go.
fn find<K, V, Q>(entries: &[(K, V)], key: &Q) -> Result<usize, usize>
where
    K: Borrow<Q>,
    Q: Ord + ?Sized,
{
    entries.binary_search_by(|(k, _)| k.borrow().cmp(key))
}

/// The entries of a [`SmallMap`] (or a range of them) in key order.
pub(crate) enum Iter<'a, K, V> {
    Few(std::slice::Iter<'a, (K, V)>),
    Many(btree_map::Range<'a, K, V>),
}

impl<'a, K, V> Iterator for Iter<'a, K, V> {
    type Item = (&'a K, &'a V);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Iter::Few(i) => i.next().map(|(k, v)| (k, v)),
            Iter::Many(i) => i.next(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            Iter::Few(i) => i.size_hint(),
            Iter::Many(i) => i.size_hint(),
        }
    }
}

impl<K, V> DoubleEndedIterator for Iter<'_, K, V> {
    fn next_back(&mut self) -> Option<Self::Item> {
        match self {
            Iter::Few(i) => i.next_back().map(|(k, v)| (k, v)),
            Iter::Many(i) => i.next_back(),
        }
    }
}

impl<'a, K: Ord, V> IntoIterator for &'a SmallMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = Iter<'a, K, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for SmallMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut map = SmallMap::new();
        for (k, v) in iter {
            map.insert(k, v);
        }
        map
    }
}

/// Equal when they hold the same entries, however they keep them.
impl<K: Ord, V: PartialEq> PartialEq for SmallMap<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<K: Ord, V: Eq> Eq for SmallMap<K, V> {}

impl<K: Ord + fmt::Debug, V: fmt::Debug> fmt::Debug for SmallMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// As `BTreeMap` serializes: a map of the entries in key order.
impl<K: Ord + Serialize, V: Serialize> Serialize for SmallMap<K, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.len()))?;
        for (k, v) in self {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// As `BTreeMap` deserializes: a key given twice keeps its last value.
impl<'de, K: Ord + Deserialize<'de>, V: Deserialize<'de>> Deserialize<'de> for SmallMap<K, V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor<K, V>(PhantomData<(K, V)>);

        impl<'de, K: Ord + Deserialize<'de>, V: Deserialize<'de>> Visitor<'de> for MapVisitor<K, V> {
            type Value = SmallMap<K, V>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut map = SmallMap::new();
                while let Some((k, v)) = access.next_entry()? {
                    map.insert(k, v);
                }
                Ok(map)
            }
        }

        deserializer.deserialize_map(MapVisitor(PhantomData))
    }
}

/// An ordered set, as `BTreeSet`, that keeps up to [`FEW`] members in a sorted vector. An
/// empty set is one null pointer: most leases hold nothing and wait for nothing, and a lease
/// keeps two sets.
#[derive(Clone)]
pub(crate) struct SmallSet<T>(Option<Box<SmallMap<T, ()>>>);

impl<T: Ord> PartialEq for SmallSet<T> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl<T: Ord> Eq for SmallSet<T> {}

impl<T> Default for SmallSet<T> {
    fn default() -> Self {
        SmallSet(None)
    }
}

impl<T: Ord> SmallSet<T> {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |m| m.len())
    }

    /// Adds `value`; false if it was there already.
    pub(crate) fn insert(&mut self, value: T) -> bool {
        let map = self.0.get_or_insert_with(Box::default);
        if map.contains_key(&value) {
            return false;
        }
        map.insert(value, ());
        true
    }

    /// Removes `value`; false if it was not there.
    pub(crate) fn remove<Q>(&mut self, value: &Q) -> bool
    where
        T: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let Some(map) = self.0.as_mut() else {
            return false;
        };
        let removed = map.remove(value).is_some();
        if map.is_empty() {
            self.0 = None;
        }
        removed
    }

    pub(crate) fn contains<Q>(&self, value: &Q) -> bool
    where
        T: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.0.as_ref().is_some_and(|m| m.contains_key(value))
    }

    pub(crate) fn clear(&mut self) {
        self.0 = None;
    }

    /// The members in order.
    pub(crate) fn iter(&self) -> SetIter<'_, T> {
        SetIter(match &self.0 {
            Some(map) => map.iter(),
            None => Iter::Few([].iter()),
        })
    }
}

/// The members of a [`SmallSet`] in order.
pub(crate) struct SetIter<'a, T>(Iter<'a, T, ()>);

impl<'a, T> Iterator for SetIter<'a, T> {
    type Item = &'a T;

    fn next(&mut self) -> Option<&'a T> {
        self.0.next().map(|(k, ())| k)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl<T> DoubleEndedIterator for SetIter<'_, T> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.0.next_back().map(|(k, ())| k)
    }
}

impl<T> Clone for SetIter<'_, T> {
    fn clone(&self) -> Self {
        SetIter(match &self.0 {
            Iter::Few(i) => Iter::Few(i.clone()),
            Iter::Many(i) => Iter::Many(i.clone()),
        })
    }
}

impl<'a, T: Ord> IntoIterator for &'a SmallSet<T> {
    type Item = &'a T;
    type IntoIter = SetIter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<T: Ord> FromIterator<T> for SmallSet<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut set = SmallSet::new();
        for value in iter {
            set.insert(value);
        }
        set
    }
}

impl<T: Ord + fmt::Debug> fmt::Debug for SmallSet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// As `BTreeSet` serializes: a sequence of the members in order.
impl<T: Ord + Serialize> Serialize for SmallSet<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.len()))?;
        for value in self {
            seq.serialize_element(value)?;
        }
        seq.end()
    }
}

impl<'de, T: Ord + Deserialize<'de>> Deserialize<'de> for SmallSet<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SeqVisitor<T>(PhantomData<T>);

        impl<'de, T: Ord + Deserialize<'de>> Visitor<'de> for SeqVisitor<T> {
            type Value = SmallSet<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut set = SmallSet::new();
                while let Some(value) = access.next_element()? {
                    set.insert(value);
                }
                Ok(set)
            }
        }

        deserializer.deserialize_seq(SeqVisitor(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;
    use bincode::Options;

    /// The snapshots' encoding (`snapshot.rs`): varint integers, little endian.
    fn bincode_options() -> impl Options {
        bincode::DefaultOptions::new()
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u8, u32),
        Remove(u8),
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u8..24, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            4 => (0u8..24).prop_map(Op::Remove),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        /// Every operation answers as `BTreeMap`'s does, iteration and ranges see the same
        /// entries, and both encode to the same bytes.
        #[test]
        fn behaves_and_encodes_as_a_btree_map(ops in prop::collection::vec(op(), 0..200)) {
            let mut small = SmallMap::new();
            let mut tree = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => prop_assert_eq!(small.insert(k, v), tree.insert(k, v)),
                    Op::Remove(k) => prop_assert_eq!(small.remove(&k), tree.remove(&k)),
                    Op::Clear => { small.clear(); tree.clear(); }
                }
                prop_assert_eq!(small.len(), tree.len());
                prop_assert!(small.iter().eq(tree.iter()));
                prop_assert!(small.iter().rev().eq(tree.iter().rev()));
                prop_assert_eq!(small.first_key_value(), tree.first_key_value());
                for k in 0u8..25 {
                    prop_assert_eq!(small.get(&k), tree.get(&k));
                    prop_assert!(small.range(..k).eq(tree.range(..k)));
                    prop_assert!(small.range(k..).eq(tree.range(k..)));
                    prop_assert!(small.range((Bound::Excluded(k), Bound::Included(k + 3)))
                        .eq(tree.range((Bound::Excluded(k), Bound::Included(k + 3)))));
                }
                let encoded = bincode_options().serialize(&small).unwrap();
                prop_assert_eq!(&encoded, &bincode_options().serialize(&tree).unwrap());
                let decoded: SmallMap<u8, u32> = bincode_options().deserialize(&encoded).unwrap();
                prop_assert_eq!(&decoded, &small);
            }
        }

        /// The set answers and encodes as `BTreeSet`.
        #[test]
        fn set_behaves_and_encodes_as_a_btree_set(ops in prop::collection::vec(op(), 0..200)) {
            let mut small = SmallSet::new();
            let mut tree = BTreeSet::new();
            for op in ops {
                match op {
                    Op::Insert(k, _) => {
                        let k = format!("s{k}");
                        prop_assert_eq!(small.insert(k.clone()), tree.insert(k));
                    }
                    Op::Remove(k) => {
                        let k = format!("s{k}");
                        prop_assert_eq!(small.remove(k.as_str()), tree.remove(k.as_str()));
                    }
                    Op::Clear => { small.clear(); tree.clear(); }
                }
                prop_assert!(small.iter().eq(tree.iter()));
                let encoded = bincode_options().serialize(&small).unwrap();
                prop_assert_eq!(&encoded, &bincode_options().serialize(&tree).unwrap());
                let decoded: SmallSet<String> = bincode_options().deserialize(&encoded).unwrap();
                prop_assert_eq!(&decoded, &small);
            }
        }
    }

    /// A map past [`FEW`] entries moves to a tree, and back to nothing once emptied; one entry
    /// keeps room for one; the map is no larger than a vector, an empty set one pointer.
    #[test]
    fn grows_into_a_tree_and_keeps_no_room_it_does_not_use() {
        assert_eq!(
            std::mem::size_of::<SmallMap<u64, u64>>(),
            std::mem::size_of::<Vec<(u64, u64)>>()
        );
        assert_eq!(std::mem::size_of::<SmallSet<String>>(), 8);
        let mut map = SmallMap::new();
        map.insert(1u64, 1u64);
        assert!(matches!(&map, SmallMap::Few(v) if v.capacity() == 1));
        for k in 2..=(FEW as u64 + 1) {
            map.insert(k, k);
        }
        assert!(matches!(map, SmallMap::Many(_)));
        for k in 1..=(FEW as u64 + 1) {
            map.remove(&k);
        }
        assert!(matches!(&map, SmallMap::Few(v) if v.capacity() == 0));
    }
}
