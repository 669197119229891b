//! CRC-32C (Castagnoli), the checksum logs use for their records, in safe Rust: eight
//! table lookups per 8 bytes ("slicing by 8"), well under a nanosecond per byte, so the
//! probe's checksum costs a decision tens of nanoseconds (no dependency added to the
//! daemon, and none to the load driver that builds it).

const POLY: u32 = 0x82F6_3B78; // reflected Castagnoli polynomial

const fn tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { POLY ^ (c >> 1) } else { c >> 1 };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut s = 1;
    while s < 8 {
        let mut i = 0;
        while i < 256 {
            let p = t[s - 1][i];
            t[s][i] = (p >> 8) ^ t[0][(p & 0xff) as usize];
            i += 1;
        }
        s += 1;
    }
    t
}

static T: [[u32; 256]; 8] = tables();

/// Adds `b` to a running CRC (start with [`START`], finish with [`finish`]).
pub fn update(mut c: u32, b: &[u8]) -> u32 {
    let mut chunks = b.chunks_exact(8);
    for x in &mut chunks {
        let lo = c ^ u32::from_le_bytes([x[0], x[1], x[2], x[3]]);
        c = T[7][(lo & 0xff) as usize]
            ^ T[6][((lo >> 8) & 0xff) as usize]
            ^ T[5][((lo >> 16) & 0xff) as usize]
            ^ T[4][(lo >> 24) as usize]
            ^ T[3][x[4] as usize]
            ^ T[2][x[5] as usize]
            ^ T[1][x[6] as usize]
            ^ T[0][x[7] as usize];
    }
    for &x in chunks.remainder() {
        c = T[0][((c ^ x as u32) & 0xff) as usize] ^ (c >> 8);
    }
    c
}

pub const START: u32 = !0;

pub fn finish(c: u32) -> u32 {
    !c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_at_a_time(b: &[u8]) -> u32 {
        let mut c = START;
        for &x in b {
            c = T[0][((c ^ x as u32) & 0xff) as usize] ^ (c >> 8);
        }
        finish(c)
    }

    /// The standard check value of CRC-32C, and slicing by 8 equal to one byte at a time
    /// for every length and split.
    #[test]
    fn is_crc32c() {
        assert_eq!(finish(update(START, b"123456789")), 0xE306_9283);
        let data: Vec<u8> = (0..100u32).map(|i| (i * 37 + 11) as u8).collect();
        for n in 0..data.len() {
            let (a, b) = data[..n].split_at(n / 3);
            assert_eq!(finish(update(update(START, a), b)), one_at_a_time(&data[..n]), "{n}");
        }
    }
}
