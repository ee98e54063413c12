//! Node classes: the values of a target's class label keys, normalised, with a readable, stable
//! id. Nodes with equal class facts can share one compiled artifact.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use sha2::{Digest, Sha256};

use crate::kiln_node::HardwareFacts;

use crate::labels::{
    ARCH, CPU_LEVEL, CUDA_RUNTIME_FULL, CUDA_RUNTIME_MAJOR, CUDA_RUNTIME_MINOR, DRIVER_FULL,
    DRIVER_MAJOR, DRIVER_MINOR, DRIVER_REVISION, GPU_COMPUTE_MAJOR, GPU_COMPUTE_MINOR, GPU_COUNT,
    GPU_MEMORY, GPU_PRODUCT, MEMORY_GIB,
};

pub use crate::labels::ClassFacts;

/// The class facts of a node with `labels`, for `keys`. GPU product names lose the `-MIG-…` and
/// `-SHARED` suffixes GPU Feature Discovery adds, so MIG or time-sliced H100s stay H100s.
pub fn class_facts<'a>(
    keys: impl IntoIterator<Item = &'a str>,
    labels: &BTreeMap<String, String>,
) -> ClassFacts {
    keys.into_iter()
        .filter_map(|key| {
            let value = labels.get(key)?;
            let value = if key == GPU_PRODUCT {
                normalise_product(value)
            } else {
                value.clone()
            };
            Some((key.to_string(), value))
        })
        .collect()
}

/// The class labels a machine with `facts` carries, as its agent would label it: exactly the
/// labels (and values) GPU Feature Discovery puts on such a node, for the keys a hardware report
/// supplies ([`FACT_KEYS`]), so a node with GFD and one without classify alike. What the operator
/// falls back to for nodes without GPU Feature Discovery labels (from their KilnNode).
pub fn fact_labels(facts: &HardwareFacts) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (ARCH.to_string(), facts.arch.clone()),
        (CPU_LEVEL.to_string(), facts.cpu_level.clone()),
    ]);
    if let Some(gib) = memory_gib(facts.memory_bytes) {
        labels.insert(MEMORY_GIB.into(), gib.to_string());
    }
    if let Some(gpu) = facts.accelerators.first() {
        labels.insert(GPU_PRODUCT.into(), gpu.product.clone());
        labels.insert(GPU_COMPUTE_MAJOR.into(), gpu.compute_major.to_string());
        labels.insert(GPU_COMPUTE_MINOR.into(), gpu.compute_minor.to_string());
        labels.insert(
            GPU_MEMORY.into(),
            (gpu.memory_bytes / (1024 * 1024)).to_string(),
        );
        labels.insert(GPU_COUNT.into(), facts.accelerators.len().to_string());
    }
    // GFD splits the driver version as written: 535.129.03 is 535 / 129 / "03".
    if let Some(driver) = facts.driver_version.as_deref().filter(|d| !d.is_empty()) {
        let mut parts = driver.split('.');
        for key in [DRIVER_MAJOR, DRIVER_MINOR, DRIVER_REVISION] {
            if let Some(p) = parts.next() {
                labels.insert(key.into(), p.to_string());
            }
        }
        labels.insert(DRIVER_FULL.into(), driver.to_string());
    }
    if let Some(cuda) = facts
        .cuda_driver_version
        .as_deref()
        .filter(|c| !c.is_empty())
    {
        let mut parts = cuda.split('.');
        for key in [CUDA_RUNTIME_MAJOR, CUDA_RUNTIME_MINOR] {
            if let Some(p) = parts.next() {
                labels.insert(key.into(), p.to_string());
            }
        }
        labels.insert(CUDA_RUNTIME_FULL.into(), cuda.to_string());
    }
    labels
}

/// The host memory step (`kiln.dev/memory-gib`) of a machine with `bytes` of memory: the largest
/// of 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, … GiB (the powers of two and one and a half times
/// them) that the memory reaches within 1/16. The slack is the kernel's: a 16 GiB machine
/// reports about 15.6 GiB of `MemTotal` and is a 16; a 20 GiB one is a 16 too, so nodes of one
/// size share a class whatever the kernel keeps. `None` for unknown (0) or under 15/16 GiB.
pub fn memory_gib(bytes: i64) -> Option<u64> {
    let bytes = u128::try_from(bytes).ok()?;
    let reach = u64::try_from(bytes * 16 / 15 / (1 << 30)).unwrap_or(u64::MAX);
    let power = 1u64.checked_shl(reach.checked_ilog2()?)?;
    let between = power / 2 * 3;
    Some(if power >= 2 && between <= reach {
        between
    } else {
        power
    })
}

/// The labels a node is classified by: the facts its agent probed (from its KilnNode) under the
/// node's own labels, so a node without GPU Feature Discovery labels still classifies by CPU
/// arch and x86-64 level, and a label set by an administrator wins. The operator and the agent
/// both call this, so they agree on every node's class.
pub fn node_class_labels(
    node_labels: &BTreeMap<String, String>,
    facts: Option<&HardwareFacts>,
) -> BTreeMap<String, String> {
    let mut labels = facts.map(fact_labels).unwrap_or_default();
    labels.extend(node_labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    labels
}

/// The class keys an agent's hardware report can supply ([`fact_labels`]).
pub const FACT_KEYS: [&str; 15] = [
    GPU_PRODUCT,
    GPU_COMPUTE_MAJOR,
    GPU_COMPUTE_MINOR,
    GPU_MEMORY,
    GPU_COUNT,
    DRIVER_MAJOR,
    DRIVER_MINOR,
    DRIVER_REVISION,
    DRIVER_FULL,
    CUDA_RUNTIME_MAJOR,
    CUDA_RUNTIME_MINOR,
    CUDA_RUNTIME_FULL,
    ARCH,
    CPU_LEVEL,
    MEMORY_GIB,
];

/// The class `keys` a node's class still waits on: those its agent's report could supply but
/// its labels lack, while no report has arrived (`reported` false). Until the report comes, the
/// node's class is unknown, not merely smaller: a CPU node classified by its labels alone would be
/// `amd64` now and `amd64 x86-64-v4` seconds later, and the first compile would be wasted. A node
/// carrying every such key as a label classifies without its agent; once the agent has reported,
/// a key it did not supply (no GPU) is absent for good.
pub fn unreported_keys<'a>(
    keys: impl IntoIterator<Item = &'a str>,
    node_labels: &BTreeMap<String, String>,
    reported: bool,
) -> Vec<&'a str> {
    if reported {
        return Vec::new();
    }
    keys.into_iter()
        .filter(|k| FACT_KEYS.contains(k) && !node_labels.contains_key(*k))
        .collect()
}

/// Whether `labels` satisfy a Kubernetes label selector (matchLabels and matchExpressions with
/// In, NotIn, Exists, DoesNotExist). An unknown operator matches nothing: fail closed.
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = selector.match_expressions.iter().flatten().all(|e| {
        let value = labels.get(&e.key);
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

/// `NVIDIA-H100-80GB-HBM3-MIG-1g.10gb` → `NVIDIA-H100-80GB-HBM3`; `…-SHARED` likewise.
pub fn normalise_product(product: &str) -> String {
    let cut = product.find("-MIG-").unwrap_or(product.len());
    let product = &product[..cut];
    product
        .strip_suffix("-SHARED")
        .unwrap_or(product)
        .to_string()
}

/// A readable, stable class id: what the hardware is, then 8 hex of the facts' hash, e.g.
/// `nvidia-h100-80gb-hbm3-sm90-drv580-amd64-3f2a9c1e` or `amd64-x86-64-v3-7b0e12aa`. Valid as a
/// label value (≤ 63 chars, lowercase alphanumerics and `-`).
pub fn class_id(facts: &ClassFacts) -> String {
    let mut parts: Vec<String> = Vec::new();
    if let Some(p) = facts.get(GPU_PRODUCT) {
        parts.push(p.clone());
    }
    if let (Some(major), Some(minor)) = (facts.get(GPU_COMPUTE_MAJOR), facts.get(GPU_COMPUTE_MINOR))
    {
        parts.push(format!("sm{major}{minor}"));
    }
    if let Some(d) = facts.get(DRIVER_MAJOR) {
        parts.push(format!("drv{d}"));
    }
    for key in [ARCH, CPU_LEVEL] {
        if let Some(v) = facts.get(key) {
            parts.push(v.clone());
        }
    }
    if let Some(gib) = facts.get(MEMORY_GIB) {
        parts.push(format!("{gib}gib"));
    }
    let mut readable: String = parts
        .join("-")
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    while readable.contains("--") {
        readable = readable.replace("--", "-");
    }
    let readable = readable.trim_matches('-');
    let readable = if readable.is_empty() { "any" } else { readable };
    let encoded = serde_json::to_vec(facts).unwrap_or_default();
    let hash = hex::encode(&Sha256::digest(&encoded)[..4]);
    let keep = 63 - 1 - hash.len();
    let readable = readable
        .get(..keep.min(readable.len()))
        .unwrap_or(readable)
        .trim_end_matches('-');
    format!("{readable}-{hash}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    #[test]
    fn a_node_waits_for_its_report_only_for_keys_the_report_supplies() {
        use crate::kiln_node::{Accelerator, HardwareFacts};
        let gpu = HardwareFacts {
            arch: "amd64".into(),
            cpu_level: "x86-64-v4".into(),
            driver_version: Some("580.65.06".into()),
            cuda_driver_version: Some("13.0".into()),
            accelerators: vec![Accelerator {
                product: "NVIDIA-H100-80GB-HBM3".into(),
                compute_major: 9,
                compute_minor: 0,
                ..Default::default()
            }],
            memory_bytes: 64 << 30,
            ..Default::default()
        };
        let labelled = fact_labels(&gpu);
        let supplied: Vec<&str> = labelled.keys().map(String::as_str).collect();
        let mut fact_keys = FACT_KEYS.to_vec();
        fact_keys.sort_unstable();
        assert_eq!(supplied, fact_keys, "FACT_KEYS is what a report can supply");

        let keys = crate::labels::DEFAULT_CLASS_KEYS;
        let cpu = labels(&[(ARCH, "amd64"), ("kubernetes.io/hostname", "n")]);
        assert_eq!(
            unreported_keys(keys, &cpu, false),
            [
                GPU_PRODUCT,
                GPU_COMPUTE_MAJOR,
                GPU_COMPUTE_MINOR,
                DRIVER_MAJOR,
                CPU_LEVEL
            ]
        );
        assert!(unreported_keys(keys, &cpu, true).is_empty(), "reported");
        assert!(
            unreported_keys([ARCH, "example.com/pool"], &cpu, false).is_empty(),
            "arch is a label and the pool key is no report's to give"
        );
        let mut full = cpu.clone();
        full.extend(labelled);
        assert!(
            unreported_keys(keys, &full, false).is_empty(),
            "fully labelled"
        );
    }

    #[test]
    fn fact_labels_are_what_gpu_feature_discovery_writes() {
        use crate::kiln_node::{Accelerator, HardwareFacts};
        // A node GFD labelled (GFD's README and a real node's labels): driver 535.129.03, CUDA
        // 12.2, one H100 80GB HBM3 of 81559 MiB.
        let gfd = labels(&[
            (GPU_PRODUCT, "NVIDIA-H100-80GB-HBM3"),
            (GPU_COMPUTE_MAJOR, "9"),
            (GPU_COMPUTE_MINOR, "0"),
            (GPU_MEMORY, "81559"),
            (GPU_COUNT, "1"),
            (DRIVER_MAJOR, "535"),
            (DRIVER_MINOR, "129"),
            (DRIVER_REVISION, "03"),
            (DRIVER_FULL, "535.129.03"),
            (CUDA_RUNTIME_MAJOR, "12"),
            (CUDA_RUNTIME_MINOR, "2"),
            (CUDA_RUNTIME_FULL, "12.2"),
            (ARCH, "amd64"),
            (CPU_LEVEL, "x86-64-v4"),
        ]);
        let facts = HardwareFacts {
            arch: "amd64".into(),
            cpu_level: "x86-64-v4".into(),
            driver_version: Some("535.129.03".into()),
            cuda_driver_version: Some("12.2".into()),
            accelerators: vec![Accelerator {
                product: "NVIDIA-H100-80GB-HBM3".into(),
                compute_major: 9,
                compute_minor: 0,
                memory_bytes: 81559 * 1024 * 1024,
                mig: false,
            }],
            ..Default::default()
        };
        assert_eq!(fact_labels(&facts), gfd);
        // So the node's class is the same whether GFD labelled it or only its agent reported.
        let keys = crate::labels::DEFAULT_CLASS_KEYS;
        let from_report = node_class_labels(&labels(&[]), Some(&facts));
        assert_eq!(class_facts(keys, &from_report), class_facts(keys, &gfd));
        assert_eq!(
            class_facts(keys, &gfd)[DRIVER_MAJOR],
            "535",
            "the driver's, not CUDA's"
        );
    }

    #[test]
    fn memory_is_classed_in_steps_that_forgive_the_kernel_its_share() {
        let gib = 1i64 << 30;
        // MemTotal of real machines: this development VM (24 GiB), a 16 GiB and a 64 GiB one.
        assert_eq!(memory_gib(24_684_084 * 1024), Some(24));
        assert_eq!(memory_gib(16_283_676 * 1024), Some(16));
        assert_eq!(memory_gib(65_842_364 * 1024), Some(64));
        for (have, step) in [(1, 1), (2, 2), (3, 3), (5, 4), (7, 6), (11, 8), (20, 16)] {
            assert_eq!(memory_gib(have * gib), Some(step), "{have} GiB");
        }
        assert_eq!(memory_gib(15 * gib), Some(16), "within 1/16 of 16");
        assert_eq!(memory_gib(15 * gib - 1), Some(12), "just under");
        assert_eq!(memory_gib(1536 * gib), Some(1536));
        for unknown in [0, -1, gib / 2, i64::MIN] {
            assert_eq!(memory_gib(unknown), None, "{unknown}");
        }
        assert!(memory_gib(i64::MAX).is_some_and(|g| g >= 1 << 32));
        let facts = HardwareFacts {
            arch: "amd64".into(),
            cpu_level: "x86-64-v3".into(),
            memory_bytes: 24_684_084 * 1024,
            ..Default::default()
        };
        let labels = fact_labels(&facts);
        assert_eq!(labels[MEMORY_GIB], "24");
        let keys = [ARCH, CPU_LEVEL, MEMORY_GIB];
        let id = class_id(&class_facts(keys, &labels));
        assert!(id.starts_with("amd64-x86-64-v3-24gib-"), "{id}");
        let unknown = HardwareFacts {
            memory_bytes: 0,
            ..facts
        };
        assert!(!fact_labels(&unknown).contains_key(MEMORY_GIB));
    }

    #[test]
    fn mig_and_shared_suffixes_do_not_split_a_gpu_model() {
        let keys = crate::labels::DEFAULT_CLASS_KEYS;
        let base = [
            (GPU_PRODUCT, "NVIDIA-H100-80GB-HBM3"),
            (GPU_COMPUTE_MAJOR, "9"),
            (GPU_COMPUTE_MINOR, "0"),
            (ARCH, "amd64"),
        ];
        let plain = class_facts(keys, &labels(&base));
        for product in [
            "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
            "NVIDIA-H100-80GB-HBM3-SHARED",
        ] {
            let mut l = labels(&base);
            l.insert(GPU_PRODUCT.into(), product.into());
            assert_eq!(class_facts(keys, &l), plain, "{product}");
        }
        let l4 = class_facts(
            keys,
            &labels(&[
                (GPU_PRODUCT, "NVIDIA-L4"),
                (GPU_COMPUTE_MAJOR, "8"),
                (GPU_COMPUTE_MINOR, "9"),
                (ARCH, "amd64"),
            ]),
        );
        assert_ne!(class_id(&plain), class_id(&l4));
    }

    #[test]
    fn id_is_readable_stable_and_a_valid_label_value() {
        let facts = class_facts(
            crate::labels::DEFAULT_CLASS_KEYS,
            &labels(&[
                (GPU_PRODUCT, "NVIDIA-H100-80GB-HBM3"),
                (GPU_COMPUTE_MAJOR, "9"),
                (GPU_COMPUTE_MINOR, "0"),
                (DRIVER_MAJOR, "580"),
                (ARCH, "amd64"),
                ("unrelated", "x"),
            ]),
        );
        let id = class_id(&facts);
        assert!(
            id.starts_with("nvidia-h100-80gb-hbm3-sm90-drv580-amd64-"),
            "{id}"
        );
        assert_eq!(id, class_id(&facts.clone()));
        let cpu = class_id(&class_facts(
            crate::labels::DEFAULT_CLASS_KEYS,
            &labels(&[(ARCH, "amd64"), (CPU_LEVEL, "x86-64-v3")]),
        ));
        assert!(cpu.starts_with("amd64-x86-64-v3-"), "{cpu}");
        let long = class_id(&labels(&[(GPU_PRODUCT, &"X".repeat(200))]));
        for id in [id, cpu, long] {
            assert!(
                id.len() <= 63
                    && id
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{id}"
            );
            assert!(!id.starts_with('-') && !id.ends_with('-'), "{id}");
        }
    }
}
