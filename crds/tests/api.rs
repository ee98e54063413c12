//! The API as users see it: the committed CRD YAML is what the types generate, CEL rules accept
//! and reject what they should (evaluated client-side with kube's CEL), and profiles bind dims
//! within bounds.

use kiln_crds::compiled_target::{ProfileError, ShapeProfile};
use kiln_crds::{CompiledTarget, ModelArtifact};
use kube::core::cel::{validate_cel, validate_cel_update};

const MODEL: &str = r#"
apiVersion: kiln.dev/v1alpha1
kind: ModelArtifact
metadata: {name: m, namespace: default}
spec:
  source: {uri: "file:///m.onnx", sha256: "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", size: 10}
  format: onnx
  inputs:
    - name: x
      dtype: f32
      dims: [{symbol: batch, min: 1, max: 8}, {size: 3}]
  fixtures:
    - {version: v1, uri: "file:///f.safetensors", sha256: "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"}
"#;

const TARGET: &str = r#"
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {name: t, namespace: default}
spec:
  modelRef: {name: m}
  backend: {kind: tract}
  profiles: [{name: b1, dims: {batch: 1}}]
  warmup: {fixtureVersion: v1}
"#;

fn model() -> ModelArtifact {
    serde_saphyr::from_str(MODEL).expect("model yaml")
}

fn target() -> CompiledTarget {
    serde_saphyr::from_str(TARGET).expect("target yaml")
}

#[test]
fn committed_crd_yaml_matches_the_types() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for dir in kiln_crds::CRD_DIRS {
        for (file, yaml) in kiln_crds::crd_yaml() {
            let committed = std::fs::read_to_string(root.join(dir).join(file)).unwrap_or_default();
            assert!(
                committed == yaml,
                "{dir}/{file} is stale: run `cargo run -p kiln-crds --bin crdgen` and commit the result"
            );
        }
    }
}

#[test]
fn defaults_fill_in_what_users_leave_out() {
    let t = target();
    assert_eq!(
        t.spec.class_label_keys,
        kiln_crds::labels::default_class_keys()
    );
    assert_eq!(
        t.spec.fallback.policy,
        kiln_crds::compiled_target::FallbackPolicy::FailClosed
    );
    assert_eq!(t.spec.warmup.iterations, 10);
    assert_eq!(t.spec.rollout.known_good_history, 3);
}

#[test]
fn valid_objects_pass_cel() {
    validate_cel(&model()).expect("model");
    validate_cel(&target()).expect("target");
}

#[test]
fn dims_are_either_fixed_or_bounded_symbols() {
    for (dim, why) in [
        (
            r#"{size: 3, symbol: batch, min: 1, max: 2}"#,
            "size and symbol",
        ),
        (r#"{symbol: batch}"#, "symbol without bounds"),
        (r#"{symbol: batch, min: 9, max: 2}"#, "min > max"),
        (r#"{size: 3, max: 4}"#, "bounds on a fixed dim"),
    ] {
        let yaml = MODEL.replace("{size: 3}", dim);
        let m: ModelArtifact = serde_saphyr::from_str(&yaml).expect("yaml");
        assert!(validate_cel(&m).is_err(), "{why} must be rejected");
    }
}

#[test]
fn content_fields_are_immutable() {
    let old = model();
    let mut changed = old.clone();
    changed.spec.source.sha256 = "c".repeat(64);
    let err = validate_cel_update(&changed, &old).expect_err("source change");
    assert!(format!("{err:?}").contains("immutable"), "{err:?}");

    let mut inputs = old.clone();
    inputs.spec.inputs[0].name = "y".into();
    assert!(validate_cel_update(&inputs, &old).is_err(), "inputs change");

    let mut fixture = old.clone();
    fixture.spec.fixtures[0].sha256 = "d".repeat(64);
    assert!(
        validate_cel_update(&fixture, &old).is_err(),
        "fixture version rewritten"
    );

    let mut added = old.clone();
    let mut v2 = added.spec.fixtures[0].clone();
    v2.version = "v2".into();
    v2.sha256 = "e".repeat(64);
    added.spec.fixtures.push(v2);
    validate_cel_update(&added, &old).expect("adding a fixture version is allowed");

    let mut license = old.clone();
    license.spec.license = Some("Apache-2.0".into());
    validate_cel_update(&license, &old).expect("license is not content");
}

#[test]
fn fallback_class_and_exec_image_are_cross_checked() {
    let bad_fallback = TARGET.replace(
        "warmup: {fixtureVersion: v1}",
        "warmup: {fixtureVersion: v1}\n  fallback: {policy: Class}",
    );
    let t: CompiledTarget = serde_saphyr::from_str(&bad_fallback).expect("yaml");
    assert!(validate_cel(&t).is_err(), "policy Class needs a class");
    let good = bad_fallback.replace("{policy: Class}", "{policy: Class, class: cpu}");
    validate_cel(&serde_saphyr::from_str::<CompiledTarget>(&good).expect("yaml"))
        .expect("class given");
    let stray = bad_fallback.replace("{policy: Class}", "{policy: FailClosed, class: cpu}");
    assert!(
        validate_cel(&serde_saphyr::from_str::<CompiledTarget>(&stray).expect("yaml")).is_err(),
        "stray class"
    );
    let exec = TARGET.replace("{kind: tract}", "{kind: exec}");
    assert!(
        validate_cel(&serde_saphyr::from_str::<CompiledTarget>(&exec).expect("yaml")).is_err(),
        "exec needs image"
    );
}

#[test]
fn profiles_bind_symbols_within_bounds() {
    let m = model().spec;
    let profile = |batch: i64| ShapeProfile {
        name: "p".into(),
        dims: [("batch".to_string(), batch)].into(),
    };
    assert_eq!(profile(4).bind(&m).expect("in bounds")["x"], vec![4, 3]);
    assert!(matches!(
        profile(9).bind(&m),
        Err(ProfileError::OutOfBounds {
            value: 9,
            max: 8,
            ..
        })
    ));
    assert!(matches!(
        profile(0).bind(&m),
        Err(ProfileError::OutOfBounds {
            value: 0,
            min: 1,
            ..
        })
    ));
    let unbound = ShapeProfile {
        name: "p".into(),
        dims: Default::default(),
    };
    let err = unbound.bind(&m).expect_err("unbound");
    assert!(
        err.to_string().contains("does not bind symbol \"batch\""),
        "{err}"
    );
    let mut extra = profile(1);
    extra.dims.insert("seq".into(), 5);
    assert!(matches!(extra.bind(&m), Err(ProfileError::Unknown { .. })));
}

#[test]
fn cuda_graphs_need_a_fallback_policy_that_keeps_compute_off_the_cpu() {
    let with = |backend: &str| -> CompiledTarget {
        serde_saphyr::from_str(&TARGET.replace("{kind: tract}", backend)).expect("yaml")
    };
    for refused in [
        "{kind: onnxruntime, cuda: {cudaGraphs: true}}",
        "{kind: onnxruntime, cuda: {cudaGraphs: true}, cpuFallback: {policy: Allowed}}",
        "{kind: auto, cuda: {cudaGraphs: true}, cpuFallback: {policy: UpToShare, maxSharePercent: 5}}",
    ] {
        let err = validate_cel(&with(refused)).expect_err(refused).to_string();
        assert!(
            err.contains("cudaGraphs") && err.contains("Forbidden"),
            "{refused}: {err}"
        );
    }
    for accepted in [
        "{kind: onnxruntime, cuda: {cudaGraphs: true}, cpuFallback: {policy: Forbidden}}",
        "{kind: auto, cuda: {cudaGraphs: true}, cpuFallback: {policy: Strict}}",
        "{kind: onnxruntime, cuda: {cudaGraphs: false}}",
        "{kind: onnxruntime, cuda: {convAlgoSearch: Heuristic}}",
    ] {
        validate_cel(&with(accepted)).expect(accepted);
    }
}

#[test]
fn llamacpp_settings_are_cross_checked() {
    let llama = TARGET.replace(
        "{kind: tract}",
        "{kind: llamacpp, llamacpp: {quantization: Q8_0}}",
    );
    validate_cel(&serde_saphyr::from_str::<CompiledTarget>(&llama).expect("yaml"))
        .expect("llamacpp with a type");
    let stray = TARGET.replace(
        "{kind: tract}",
        "{kind: tract, llamacpp: {quantization: Q8_0}}",
    );
    assert!(
        validate_cel(&serde_saphyr::from_str::<CompiledTarget>(&stray).expect("yaml")).is_err(),
        "llamacpp settings on tract"
    );
    let auto = TARGET.replace(
        "{kind: tract}",
        "{kind: llamacpp, llamacpp: {quantization: auto}}",
    );
    assert!(
        validate_cel(&serde_saphyr::from_str::<CompiledTarget>(&auto).expect("yaml")).is_err(),
        "auto without a memory budget"
    );
    let budget = auto.replace(
        "warmup: {fixtureVersion: v1}",
        "warmup: {fixtureVersion: v1, memoryBudget: 8Gi}",
    );
    validate_cel(&serde_saphyr::from_str::<CompiledTarget>(&budget).expect("yaml"))
        .expect("auto with a budget");
    // Or sized by each class's host memory: the memory fact among the class keys.
    let by_class = auto.replace(
        "warmup: {fixtureVersion: v1}",
        "warmup: {fixtureVersion: v1}\n  classLabelKeys: [kubernetes.io/arch, kiln.dev/memory-gib]",
    );
    validate_cel(&serde_saphyr::from_str::<CompiledTarget>(&by_class).expect("yaml"))
        .expect("auto by the class's memory");
    let other_keys = by_class.replace("kiln.dev/memory-gib", "kiln.dev/cpu-level");
    let err = validate_cel(&serde_saphyr::from_str::<CompiledTarget>(&other_keys).expect("yaml"))
        .expect_err("auto with neither");
    assert!(
        format!("{err:?}").contains("kiln.dev/memory-gib"),
        "{err:?}"
    );
}

#[test]
fn quantization_auto_keys_what_it_fits_and_a_named_type_does_not() {
    use kiln_crds::{CompileKeyInput, compile_key};
    let key = |backend: &str, budget: &str, gib: Option<&str>| {
        let yaml = TARGET.replace("{kind: tract}", backend).replace(
            "warmup: {fixtureVersion: v1}",
            &format!("warmup: {{fixtureVersion: v1{budget}}}"),
        );
        let t: CompiledTarget = serde_saphyr::from_str(&yaml).expect("yaml");
        let mut class = kiln_crds::class::ClassFacts::from([(
            "kubernetes.io/arch".to_string(),
            "amd64".to_string(),
        )]);
        if let Some(g) = gib {
            class.insert(kiln_crds::labels::MEMORY_GIB.into(), g.into());
        }
        compile_key(&CompileKeyInput::for_target(
            &model().spec,
            &t.spec,
            &class,
            "0.1.160",
        ))
    };
    let auto = "{kind: llamacpp, llamacpp: {quantization: auto}}";
    let q8 = "{kind: llamacpp, llamacpp: {quantization: Q8_0}}";
    // Same class facts, same key; another memory step or budget, another key.
    assert_eq!(key(auto, "", Some("16")), key(auto, "", Some("16")));
    assert_ne!(key(auto, "", Some("16")), key(auto, "", Some("32")));
    assert_ne!(
        key(auto, ", memoryBudget: 8Gi", None),
        key(auto, ", memoryBudget: 4Gi", None)
    );
    // A named type does not depend on the budget: the budget stays out of its key.
    assert_eq!(
        key(q8, ", memoryBudget: 8Gi", None),
        key(q8, ", memoryBudget: 4Gi", None)
    );
    assert_eq!(key(q8, ", memoryBudget: 8Gi", None), key(q8, "", None));
}
