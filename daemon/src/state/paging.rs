//! Opaque page cursors over ordered ranges.
//!
//! A token names a position between two keys of the listing's order, so pages stay correct
//! while items come and go between calls:
//!
//! | token       | meaning                                    |
//! | ----------- | ------------------------------------------ |
//! | (empty)     | the first page                             |
//! | `f.<hex>`   | the items after key (exclusive), forwards  |
//! | `F.<hex>`   | the items from key (inclusive), forwards   |
//! | `b.<hex>`   | the items before key (exclusive), backwards |
//! | `B.<hex>`   | the items up to key (inclusive), backwards |
//!
//! `<hex>` is the lowercase hex of the key's bytes ([`CursorKey`]). Invariants of every
//! [`Page`] built here:
//! - items are in ascending key order, at most `limit` of them
//! - `next_token` is empty iff no visible item follows the page's position
//! - `previous_token` is empty iff no visible item precedes the page's position
//! - a garbage token is `InvalidArgument` naming `pagination_token`, never a panic

use std::ops::Bound;

use super::types::{Error, Page, PageRequest};
use super::validate;

/// A key that can be written into a cursor and read back.
pub(crate) trait CursorKey: Sized + Ord + Clone {
    fn to_cursor_bytes(&self) -> Vec<u8>;
    fn from_cursor_bytes(bytes: &[u8]) -> Option<Self>;
}

impl CursorKey for String {
    fn to_cursor_bytes(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
    fn from_cursor_bytes(bytes: &[u8]) -> Option<Self> {
        String::from_utf8(bytes.to_vec()).ok()
    }
}

impl CursorKey for u64 {
    fn to_cursor_bytes(&self) -> Vec<u8> {
        self.to_be_bytes().to_vec()
    }
    fn from_cursor_bytes(bytes: &[u8]) -> Option<Self> {
        let array: [u8; 8] = bytes.try_into().ok()?;
        Some(u64::from_be_bytes(array))
    }
}

/// Where a page starts (forwards) or ends (backwards).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Cursor<K> {
    First,
    After(K),
    From(K),
    Before(K),
    UpTo(K),
}

impl<K: CursorKey> Cursor<K> {
    fn encode(&self) -> String {
        let (tag, key) = match self {
            Cursor::First => return String::new(),
            Cursor::After(k) => ('f', k),
            Cursor::From(k) => ('F', k),
            Cursor::Before(k) => ('b', k),
            Cursor::UpTo(k) => ('B', k),
        };
        let bytes = key.to_cursor_bytes();
        let mut out = String::with_capacity(2 + 2 * bytes.len());
        out.push(tag);
        out.push('.');
        for b in bytes {
            out.push(hex_digit(b >> 4));
            out.push(hex_digit(b & 0xf));
        }
        out
    }

    fn decode(token: &str) -> Result<Self, Error> {
        if token.is_empty() {
            return Ok(Cursor::First);
        }
        Self::try_decode(token).ok_or_else(|| Error::invalid("pagination_token is not valid"))
    }

    fn try_decode(token: &str) -> Option<Self> {
        let bytes = token.as_bytes();
        let (tag, rest) = match bytes {
            [tag, b'.', rest @ ..] => (*tag, rest),
            _ => return None,
        };
        if rest.len() % 2 != 0 {
            return None;
        }
        let mut key = Vec::with_capacity(rest.len() / 2);
        for pair in rest.chunks_exact(2) {
            let [hi, lo] = pair else { return None };
            key.push((hex_value(*hi)? << 4) | hex_value(*lo)?);
        }
        let key = K::from_cursor_bytes(&key)?;
        // Only the canonical spelling is accepted, so a token maps to one position.
        let cursor = match tag {
            b'f' => Cursor::After(key),
            b'F' => Cursor::From(key),
            b'b' => Cursor::Before(key),
            b'B' => Cursor::UpTo(key),
            _ => return None,
        };
        (cursor.encode() == token).then_some(cursor)
    }
}

fn hex_digit(nibble: u8) -> char {
    char::from(b"0123456789abcdef"[usize::from(nibble & 0xf)])
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// Builds one page of a listing.
///
/// `range(lo, hi)` yields the *visible* items whose keys lie within the bounds, in ascending
/// key order, as `(key, view)`; it is only ever called with at least one bound `Unbounded`, so
/// a `BTreeMap::range` over it cannot panic. Hidden items (e.g. of expired leases) are simply
/// not yielded and are skipped by both the page and the "is there more" checks.
pub(crate) fn paginate<K, T, I, F>(request: &PageRequest, range: F) -> Result<Page<T>, Error>
where
    K: CursorKey,
    I: DoubleEndedIterator<Item = (K, T)>,
    F: Fn(Bound<K>, Bound<K>) -> I,
{
    let limit = validate::page_limit(request.limit)?;
    let cursor = Cursor::<K>::decode(&request.token)?;
    let any_after = |k: &K| {
        range(Bound::Excluded(k.clone()), Bound::Unbounded)
            .next()
            .is_some()
    };
    let any_from = |k: &K| {
        range(Bound::Included(k.clone()), Bound::Unbounded)
            .next()
            .is_some()
    };
    let any_before = |k: &K| {
        range(Bound::Unbounded, Bound::Excluded(k.clone()))
            .next_back()
            .is_some()
    };
    let any_up_to = |k: &K| {
        range(Bound::Unbounded, Bound::Included(k.clone()))
            .next_back()
            .is_some()
    };

    // The page, plus the cursors to use when it comes out empty (what lies before / after).
    type Built<K, T> = (Vec<(K, T)>, Option<Cursor<K>>, Option<Cursor<K>>);
    let (items, at_start, at_end): Built<K, T> = match cursor {
        Cursor::First | Cursor::After(_) | Cursor::From(_) => {
            let lo = match &cursor {
                Cursor::After(k) => Bound::Excluded(k.clone()),
                Cursor::From(k) => Bound::Included(k.clone()),
                _ => Bound::Unbounded,
            };
            let items: Vec<(K, T)> = range(lo, Bound::Unbounded).take(limit).collect();
            // What lies before an empty forward page: everything up to the cursor.
            let before_empty = match cursor {
                Cursor::After(k) => any_up_to(&k).then_some(Cursor::UpTo(k)),
                Cursor::From(k) => any_before(&k).then_some(Cursor::Before(k)),
                _ => None,
            };
            (items, before_empty, None)
        }
        Cursor::Before(_) | Cursor::UpTo(_) => {
            let hi = match &cursor {
                Cursor::Before(k) => Bound::Excluded(k.clone()),
                Cursor::UpTo(k) => Bound::Included(k.clone()),
                _ => Bound::Unbounded,
            };
            let mut items: Vec<(K, T)> = range(Bound::Unbounded, hi).rev().take(limit).collect();
            items.reverse();
            // What lies after an empty backward page: everything from the cursor on.
            let after_empty = match cursor {
                Cursor::Before(k) => any_from(&k).then_some(Cursor::From(k)),
                Cursor::UpTo(k) => any_after(&k).then_some(Cursor::After(k)),
                _ => None,
            };
            (items, None, after_empty)
        }
    };

    let previous = match items.first() {
        Some((first, _)) => any_before(first).then(|| Cursor::Before(first.clone())),
        None => at_start,
    };
    let next = match items.last() {
        Some((last, _)) => any_after(last).then(|| Cursor::After(last.clone())),
        None => at_end,
    };
    Ok(Page {
        items: items.into_iter().map(|(_, item)| item).collect(),
        next_token: next.map(|c| c.encode()).unwrap_or_default(),
        previous_token: previous.map(|c| c.encode()).unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::state::ErrorKind;

    fn map(keys: &[u64]) -> BTreeMap<u64, bool> {
        keys.iter().map(|&k| (k, true)).collect()
    }

    fn page(m: &BTreeMap<u64, bool>, token: &str, limit: i32) -> Page<u64> {
        let request = PageRequest {
            token: token.to_string(),
            limit,
        };
        paginate(&request, |lo, hi| {
            m.range((lo, hi))
                .filter(|(_, visible)| **visible)
                .map(|(k, _)| (*k, *k))
        })
        .expect("valid page")
    }

    #[test]
    fn walks_forwards_and_backwards() {
        let m = map(&[1, 2, 3, 4, 5]);
        let p1 = page(&m, "", 2);
        assert_eq!(p1.items, vec![1, 2]);
        assert_eq!(p1.previous_token, "");
        let p2 = page(&m, &p1.next_token, 2);
        assert_eq!(p2.items, vec![3, 4]);
        let p3 = page(&m, &p2.next_token, 2);
        assert_eq!(p3.items, vec![5]);
        assert_eq!(p3.next_token, "");
        let back = page(&m, &p3.previous_token, 2);
        assert_eq!(back.items, vec![3, 4]);
        let back = page(&m, &back.previous_token, 2);
        assert_eq!(back.items, vec![1, 2]);
        assert_eq!(back.previous_token, "");
        assert_eq!(back.next_token, p1.next_token);
    }

    #[test]
    fn exact_fit_has_no_next_page() {
        let m = map(&[1, 2]);
        let p = page(&m, "", 2);
        assert_eq!(p.items, vec![1, 2]);
        assert_eq!((p.next_token.as_str(), p.previous_token.as_str()), ("", ""));
        let empty = page(&BTreeMap::new(), "", 0);
        assert!(empty.items.is_empty() && empty.next_token.is_empty());
    }

    #[test]
    fn hidden_items_are_skipped_and_do_not_count_as_more() {
        let mut m = map(&[1, 2, 3]);
        m.insert(4, false);
        m.insert(0, false);
        let p = page(&m, "", 3);
        assert_eq!(p.items, vec![1, 2, 3]);
        assert_eq!(p.next_token, "");
        assert_eq!(p.previous_token, "");
    }

    #[test]
    fn pages_emptied_by_deletes_can_still_go_back() {
        // t=0  list [1,2] [3,4]; then 3 and 4 are deleted; the next page is empty
        let mut m = map(&[1, 2, 3, 4]);
        let p1 = page(&m, "", 2);
        let p2_token = p1.next_token.clone();
        m.remove(&3);
        m.remove(&4);
        let p2 = page(&m, &p2_token, 2);
        assert!(p2.items.is_empty());
        assert_eq!(p2.next_token, "");
        let back = page(&m, &p2.previous_token, 2);
        assert_eq!(back.items, vec![1, 2]);
        // and an empty backwards page can go forwards again
        let mut m = map(&[5, 6]);
        let p = page(&m, "", 1);
        let p2 = page(&m, &p.next_token, 1);
        m.remove(&5);
        let empty = page(&m, &p2.previous_token, 1);
        assert!(empty.items.is_empty());
        assert_eq!(empty.previous_token, "");
        assert_eq!(page(&m, &empty.next_token, 1).items, vec![6]);
    }

    #[test]
    fn string_keys_round_trip() {
        let m: BTreeMap<String, ()> = ["a", "b", "c"]
            .iter()
            .map(|s| (s.to_string(), ()))
            .collect();
        let request = PageRequest {
            token: String::new(),
            limit: 1,
        };
        let list = |request: &PageRequest| {
            paginate(request, |lo, hi| {
                m.range((lo, hi)).map(|(k, _)| (k.clone(), k.clone()))
            })
            .expect("valid page")
        };
        let p1 = list(&request);
        assert_eq!(p1.items, vec!["a"]);
        assert_eq!(p1.next_token, "f.61");
        let p2 = list(&PageRequest {
            token: p1.next_token,
            limit: 1,
        });
        assert_eq!(p2.items, vec!["b"]);
    }

    #[test]
    fn garbage_tokens_are_invalid_argument() {
        let m = map(&[1]);
        for token in [
            "x",
            "f.",
            "f.0",
            "f.zz",
            "q.00",
            "f.00",
            "f.0000000000000001ff",
            "f.ABCDEF0011223344",
            "🦀",
        ] {
            let request = PageRequest {
                token: token.to_string(),
                limit: 0,
            };
            let err = paginate(&request, |lo, hi| m.range((lo, hi)).map(|(k, _)| (*k, *k)))
                .expect_err(token);
            assert_eq!(err.kind, ErrorKind::InvalidArgument);
            assert!(err.message.contains("pagination_token"));
        }
        let request = PageRequest {
            token: String::new(),
            limit: -5,
        };
        let err = paginate(&request, |lo, hi| m.range((lo, hi)).map(|(k, _)| (*k, *k)))
            .expect_err("negative limit");
        assert!(err.message.contains("limit"));
    }

    #[test]
    fn invalid_utf8_in_a_string_cursor_is_refused() {
        let m: BTreeMap<String, ()> = BTreeMap::new();
        let request = PageRequest {
            token: "f.ff".to_string(),
            limit: 0,
        };
        let err = paginate(&request, |lo, hi| {
            m.range((lo, hi)).map(|(k, _)| (k.clone(), ()))
        })
        .expect_err("not utf-8");
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
    }
}
