//! Who is writing: host names, pid liveness and the writer identity written
//! into temp-file names.
//!
//! A pid only means something inside one PID namespace of one boot of one
//! machine, and a host name does not identify any of those (two containers
//! may share a host name while living in different PID namespaces). So a
//! writer's identity is `(host, namespace id, pid)`, where the namespace id
//! digests the kernel boot id and the inode of `/proc/self/ns/pid`. A reader
//! may conclude "that writer is dead" from its pid only when host *and*
//! namespace id are its own; see [`TempOwner::provably_dead`].

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Prefix of every temp file.
pub const TMP_PREFIX: &str = ".tmp-";

/// This host's name, sanitised for file names (see [`sanitize_host`]).
pub fn this_host() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is valid for buf.len() bytes; gethostname NUL-terminates on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let raw = if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "unknown".to_owned()
    };
    sanitize_host(&raw)
}

/// Hosts go in file names: keep `[A-Za-z0-9.]` (other bytes become `_`; `-`
/// separates fields).
pub fn sanitize_host(raw: &str) -> String {
    let s: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() {
        "unknown".to_owned()
    } else {
        s
    }
}

/// Whether a process with this pid exists in *this* PID namespace. Never
/// panics: zero, negative and out-of-range pids are not alive.
pub fn pid_alive(pid: i64) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 performs only the existence and permission check.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// 64 random bits (time and address entropy if the OS has none to give).
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        // Uniqueness also rests on pid and nanos.
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        return (t as u64) ^ ((&b as *const _ as u64).rotate_left(17));
    }
    u64::from_le_bytes(b)
}

/// An id of this process's PID namespace on this boot of this machine: 12 hex
/// digits of BLAKE3 over the kernel boot id and the device and inode of
/// `/proc/self/ns/pid`. `None` when either cannot be read (no `/proc`): then
/// nobody can prove this process dead by its pid, only by age.
pub fn namespace_id() -> Option<&'static str> {
    static ID: OnceLock<Option<String>> = OnceLock::new();
    ID.get_or_init(|| {
        use std::os::unix::fs::MetadataExt;
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let boot = boot.trim();
        if boot.is_empty() {
            return None;
        }
        let ns = std::fs::metadata("/proc/self/ns/pid").ok()?;
        let mut h = blake3::Hasher::new();
        h.update(b"fxpiece pid namespace\0");
        h.update(boot.as_bytes());
        h.update(&ns.dev().to_le_bytes());
        h.update(&ns.ino().to_le_bytes());
        Some(crate::hash::to_hex(&h.finalize().as_bytes()[..6]))
    })
    .as_deref()
}

/// Name of a new temp file of this process: `.tmp-<host>-<ns>-<pid>-<rand>`,
/// with `<ns>` the [`namespace_id`] (or `nons` when there is none).
pub fn temp_name(host: &str) -> String {
    format!(
        "{TMP_PREFIX}{host}-{}-{}-{:016x}",
        namespace_id().unwrap_or("nons"),
        std::process::id(),
        random_u64()
    )
}

/// The writer a temp-file name says it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TempOwner<'a> {
    pub host: &'a str,
    /// `None` for names written before namespace ids (`.tmp-<host>-<pid>-<rand>`)
    /// and by writers without `/proc`.
    pub namespace: Option<&'a str>,
    pub pid: Option<i64>,
}

impl<'a> TempOwner<'a> {
    /// Parse a temp-file name; `None` if it is not one.
    pub fn parse(name: &'a str) -> Option<TempOwner<'a>> {
        let rest = name.strip_prefix(TMP_PREFIX)?;
        let fields: Vec<&str> = rest.split('-').collect();
        match fields.as_slice() {
            [host, ns, pid, _rand] => Some(TempOwner {
                host,
                namespace: Some(*ns).filter(|n| *n != "nons"),
                pid: pid.parse().ok(),
            }),
            [host, pid, _rand] => Some(TempOwner {
                host,
                namespace: None,
                pid: pid.parse().ok(),
            }),
            _ => None,
        }
    }

    /// Whether the writer is certainly gone: same host name, same PID
    /// namespace of the same boot, and no such pid. Anything less (another
    /// host, another container sharing the host name, an old-style name
    /// without a namespace id) proves nothing.
    pub fn provably_dead(&self, my_host: &str) -> bool {
        let Some(mine) = namespace_id() else {
            return false;
        };
        self.host == my_host && self.namespace == Some(mine) && self.pid.is_some_and(|p| !pid_alive(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_alive_never_panics_and_sees_itself() {
        assert!(pid_alive(i64::from(std::process::id())));
        for absurd in [0, -1, i64::MIN, i64::MAX, 1 << 40, 4_999_999] {
            assert!(!pid_alive(absurd), "{absurd}");
        }
    }

    #[test]
    fn host_names_are_file_name_safe() {
        assert_eq!(sanitize_host("a-b c/d.e"), "a_b_c_d.e");
        assert_eq!(sanitize_host(""), "unknown");
        let h = this_host();
        assert!(!h.is_empty() && !h.contains('-') && !h.contains('/'));
    }

    #[test]
    fn temp_names_round_trip_and_carry_the_namespace() {
        let name = temp_name("hostA");
        let o = TempOwner::parse(&name).unwrap();
        assert_eq!(o.host, "hostA");
        assert_eq!(o.pid, Some(i64::from(std::process::id())));
        assert_eq!(o.namespace, namespace_id());
        assert!(!o.provably_dead("hostA"), "we are alive");
        let old = TempOwner::parse(".tmp-hostA-4999999-00000000deadbeef").unwrap();
        assert_eq!((old.namespace, old.pid), (None, Some(4_999_999)));
        assert!(!old.provably_dead("hostA"), "no namespace id: proves nothing");
        assert!(TempOwner::parse(".tmp-what").is_none());
        assert!(TempOwner::parse("log-1.json").is_none());
    }

    #[test]
    fn dead_only_in_our_own_namespace() {
        let Some(ns) = namespace_id() else {
            return; // no /proc: nothing is ever provably dead
        };
        let dead = format!(".tmp-hostA-{ns}-4999999-00000000deadbeef");
        assert!(TempOwner::parse(&dead).unwrap().provably_dead("hostA"));
        assert!(!TempOwner::parse(&dead).unwrap().provably_dead("hostB"));
        let elsewhere = ".tmp-hostA-0123456789ab-4999999-00000000deadbeef";
        assert!(!TempOwner::parse(elsewhere).unwrap().provably_dead("hostA"));
    }
}
