//! The lines a crash-test writer (`log-writer`) prints on stdout, one event per line, flushed
//! as it happens so that a `kill -9` loses at most a line being written:
//!
//! ```text
//! OPEN <log_start_offset> <log_end_offset>            the log is recovered and open
//! ACK <base_offset> <last_offset> <content_hash:016x>  an append returned Ok
//! ```
//!
//! `content_hash` is [`crate::content::content_hash`] of the batch appended.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriterLine {
    Open {
        log_start_offset: i64,
        log_end_offset: i64,
    },
    Ack {
        base_offset: i64,
        last_offset: i64,
        content_hash: u64,
    },
}

impl fmt::Display for WriterLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WriterLine::Open {
                log_start_offset,
                log_end_offset,
            } => write!(f, "OPEN {log_start_offset} {log_end_offset}"),
            WriterLine::Ack {
                base_offset,
                last_offset,
                content_hash,
            } => write!(f, "ACK {base_offset} {last_offset} {content_hash:016x}"),
        }
    }
}

impl WriterLine {
    /// Parses one line, without its newline.
    pub fn parse(line: &str) -> Result<WriterLine, String> {
        let bad = || format!("malformed writer line {line:?}");
        let fields: Vec<&str> = line.split(' ').collect();
        let int = |s: &str| s.parse::<i64>().map_err(|_| bad());
        match fields.as_slice() {
            ["OPEN", start, end] => Ok(WriterLine::Open {
                log_start_offset: int(start)?,
                log_end_offset: int(end)?,
            }),
            ["ACK", base, last, hash] => Ok(WriterLine::Ack {
                base_offset: int(base)?,
                last_offset: int(last)?,
                content_hash: u64::from_str_radix(hash, 16).map_err(|_| bad())?,
            }),
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        for line in [
            WriterLine::Open {
                log_start_offset: 0,
                log_end_offset: 12345,
            },
            WriterLine::Ack {
                base_offset: 7,
                last_offset: 9,
                content_hash: 0x0123_4567_89ab_cdef,
            },
        ] {
            assert_eq!(WriterLine::parse(&line.to_string()), Ok(line));
        }
        assert!(WriterLine::parse("ACK 1 2").is_err());
        assert!(WriterLine::parse("ACK 1 2 zz").is_err());
        assert!(WriterLine::parse("OPEN 1 2 3").is_err());
    }
}
