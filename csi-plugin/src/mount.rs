//! The mount syscalls, behind three thin functions, and the one decision about them (is a path a
//! mount point, read-only?) as a pure parse of `/proc/self/mountinfo`. Needs `CAP_SYS_ADMIN`;
//! the node plugin's container is privileged for this alone.

use std::io;
use std::path::Path;

use rustix::mount::{MountFlags, UnmountFlags};

/// A mount at a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mounted {
    /// Mounted read-only (`ro` among the mount's options).
    pub read_only: bool,
}

/// The topmost mount at `target` in this process's mount namespace, if any.
pub fn at(target: &Path) -> io::Result<Option<Mounted>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(parse(&info, target))
}

/// The last (topmost) line of `mountinfo` whose mount point is `target`. Fields: id, parent,
/// major:minor, root, mount point (octal escapes for space, tab, newline, backslash), options.
pub fn parse(mountinfo: &str, target: &Path) -> Option<Mounted> {
    let want = target.to_str()?;
    mountinfo
        .lines()
        .filter_map(|line| {
            let mut f = line.split(' ');
            let point = f.nth(4)?;
            let options = f.next()?;
            (unescape(point) == want).then(|| Mounted {
                read_only: options.split(',').any(|o| o == "ro"),
            })
        })
        .next_back()
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(char::from(c));
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Mounts `source` onto `target` read-only, nosuid and nodev, read-only in every mount namespace
/// the mount propagates to. A bind mount takes flags only on a remount, and a remount does not
/// propagate: binding `target` and then remounting it would leave the copies the kubelet and the
/// host see (target paths are shared mounts) writable. So `source` is bound onto itself (its
/// mount, the node cache's, propagates nowhere) and made read-only there, then that read-only
/// mount is bound onto `target` (a bind copies the source mount's flags, and so does every
/// propagated copy), and the self-bind goes. On any failure nothing stays mounted.
pub fn bind_read_only(source: &Path, target: &Path) -> io::Result<()> {
    rustix::mount::mount_bind(source, source)?;
    let flags = MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV;
    let bound = rustix::mount::mount_remount(source, flags, "")
        .and_then(|()| rustix::mount::mount_bind(source, target));
    let _ = unmount(source);
    bound.map_err(io::Error::from)
}

/// Unmounts `target`; lazily (detached, gone once the last user lets go) when it is busy.
pub fn unmount(target: &Path) -> io::Result<()> {
    match rustix::mount::unmount(target, UnmountFlags::empty()) {
        Err(rustix::io::Errno::BUSY) => {
            rustix::mount::unmount(target, UnmountFlags::DETACH).map_err(io::Error::from)
        }
        other => other.map_err(io::Error::from),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
90 22 8:1 /var/lib/kiln/cache/published/csi-1 /var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/model/mount rw,relatime shared:1 - ext4 /dev/vda rw
91 90 8:1 /var/lib/kiln/cache/published/csi-1 /var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/model/mount ro,nosuid,nodev,relatime shared:1 - ext4 /dev/vda rw
92 22 8:1 /x /mnt/with\\040space ro shared:1 - ext4 /dev/vda rw
";

    #[test]
    fn the_topmost_mount_at_a_path_decides() {
        let p = Path::new("/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/model/mount");
        assert_eq!(parse(INFO, p), Some(Mounted { read_only: true }));
        let only_rw: String = INFO.lines().take(2).map(|l| format!("{l}\n")).collect();
        assert_eq!(parse(&only_rw, p), Some(Mounted { read_only: false }));
        assert_eq!(parse(INFO, Path::new("/var/lib/kubelet/pods/u")), None);
        assert_eq!(
            parse(INFO, Path::new("/mnt/with space")),
            Some(Mounted { read_only: true })
        );
        assert_eq!(parse("garbage\n\n", p), None);
    }
}
