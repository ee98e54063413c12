//! Kubernetes object names as the apiserver checks them (apimachinery's `IsDNS1123Label` and
//! `IsDNS1123Subdomain`), for names kiln takes from places no apiserver validated: a CSI
//! request's volume attributes, a YAML file for `kiln-agent local`, a command line. Pure.

/// A DNS-1123 label: 1–63 lowercase letters, digits and '-', starting and ending with a letter
/// or digit (a namespace's name).
pub fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && is_label_shaped(s)
}

/// A DNS-1123 subdomain: at most 253 characters of dot-separated label-shaped parts (an
/// object's name). As in Kubernetes, a part may be longer than a label's 63 characters.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_label_shaped)
}

fn is_label_shaped(s: &str) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-';
    let edge = |c: Option<&u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    !b.is_empty() && b.iter().all(inner) && edge(b.first()) && edge(b.last())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_as_the_apiserver_checks_them() {
        assert!(is_dns1123_subdomain("a.b-c.d0"));
        assert!(is_dns1123_subdomain(&"a".repeat(70)), "a valid object name");
        assert!(!is_dns1123_subdomain(&"a".repeat(254)));
        for bad in ["", "a_b", "-a", "a-", "a..b", "A", "a."] {
            assert!(!is_dns1123_subdomain(bad), "{bad:?}");
        }
        assert!(is_dns1123_label(&"a".repeat(63)));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(!is_dns1123_label("a.b"));
    }
}
