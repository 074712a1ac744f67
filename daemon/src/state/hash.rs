//! FNV-1a 64: the state hash's function and the storage checksums'. A leaf: it knows nothing
//! of the state.

/// FNV-1a, 64 bit: fixed, portable, written out so no library's hasher choice can change it.
pub(super) struct Fnv1a(pub(super) u64);

impl Fnv1a {
    pub(super) const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn update(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }
}

/// 64-bit FNV-1a of `bytes`: the state hash's function, also the storage checksums'. Not
/// cryptographic: it catches torn writes and bit rot, not tampering.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hasher = Fnv1a(Fnv1a::OFFSET_BASIS);
    hasher.update(bytes);
    hasher.0
}

impl std::io::Write for Fnv1a {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.update(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
