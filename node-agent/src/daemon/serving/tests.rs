use super::*;
use kiln_crds::kiln_node::NodePhase;

fn pod(annotations: &str, containers_ready: bool, restarts: i32) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "server-0", "namespace": "ns", "uid": "u1",
            "annotations": serde_json::from_str::<serde_json::Value>(annotations).expect("json"),
        },
        "spec": {"containers": [{"name": "c"}], "readinessGates": [{"conditionType": "kiln.dev/warm"}]},
        "status": {
            "podIP": "10.0.0.7",
            "conditions": [{"type": "ContainersReady", "status": if containers_ready { "True" } else { "False" }}],
            "containerStatuses": [{"name": "c", "ready": containers_ready, "restartCount": restarts,
                "image": "x", "imageID": "x"}],
        },
    }))
    .expect("pod")
}

const OIP: &str =
    r#"{"kiln.dev/target": "sq", "kiln.dev/protocol": "oip-v2", "kiln.dev/port": "8000"}"#;

fn row() -> NodeTargetStatus {
    NodeTargetStatus {
        namespace: "ns".into(),
        name: "sq".into(),
        revision: 2,
        class: "cpu".into(),
        phase: NodePhase::Ready,
        artifact_digest: Some("ab".into()),
        ..Default::default()
    }
}

fn served() -> GateCondition {
    GateCondition {
        status: true,
        reason: "Ready".into(),
        message: "revision 2 verified".into(),
    }
}

fn figures() -> Figures {
    Figures {
        requests: 3,
        first_seconds: 0.02,
        p50_seconds: 0.01,
        after_seconds: 0.011,
        parity_max_abs_error: 1e-6,
    }
}

fn seen<'a>(p: &Pod, check: Option<&'a Check>) -> Seen<'a> {
    Seen {
        endpoint: endpoint(p, "sq").expect("annotated"),
        check,
        mounted: None,
    }
}

fn decide_now(p: &Pod, check: Option<&Check>, now: Instant) -> Decision {
    decide(p, &row(), served(), seen(p, check), now)
}

#[test]
fn never_true_before_the_server_answered_within_tolerance() {
    let now = Instant::now();
    let p = pod(OIP, true, 0);
    let first = decide_now(&p, None, now);
    assert!(!first.warm.status);
    assert_eq!(first.warm.reason, "WarmingServer");
    let (e, key) = first.start.clone().expect("a check starts");
    assert_eq!(e.base, "http://10.0.0.7:8000");
    assert_eq!(e.model, "sq", "the target's name by default");
    let running = Check::Running(key.clone(), None);
    let d = decide_now(&p, Some(&running), now);
    assert!(!d.warm.status && d.start.is_none(), "one check at a time");
    let warm = Check::Passed(key, figures());
    let d = decide_now(&p, Some(&warm), now);
    assert!(d.warm.status, "{d:?}");
    assert!(d.warm.message.contains("p50 10.0 ms"), "{}", d.warm.message);
}

#[test]
fn the_row_decides_first_and_containers_must_be_ready() {
    let now = Instant::now();
    let p = pod(OIP, true, 0);
    let failed = GateCondition {
        status: false,
        reason: "HashMismatch".into(),
        message: "m".into(),
    };
    let d = decide(&p, &row(), failed.clone(), seen(&p, None), now);
    assert_eq!((d.warm, d.start), (failed, None));
    let d = decide_now(&pod(OIP, false, 0), None, now);
    assert_eq!(d.warm.reason, "WaitingForServer");
    assert!(d.start.is_none());
}

#[test]
fn a_restart_or_a_new_revision_warms_again() {
    let now = Instant::now();
    let p = pod(OIP, true, 0);
    let (_, key) = decide_now(&p, None, now).start.expect("start");
    let warm = Check::Passed(key, figures());
    let restarted = pod(OIP, true, 1);
    let d = decide_now(&restarted, Some(&warm), now);
    assert!(
        !d.warm.status && d.start.is_some(),
        "restart count up: cold"
    );
    let newer = NodeTargetStatus {
        revision: 3,
        ..row()
    };
    let d = decide(&p, &newer, served(), seen(&p, Some(&warm)), now);
    // The same server (pod, restart count) passed before: it stays warm while checked again.
    assert!(
        d.warm.status && d.start.is_some(),
        "new revision: checked again, still warm"
    );
    assert!(
        d.warm
            .message
            .contains("checking the same server again for revision 3"),
        "{}",
        d.warm.message
    );
    let (_, key3) = d.start.expect("start");
    let running = Check::Running(key3.clone(), still_warm(Some(&warm), &key3));
    let d = decide(&p, &newer, served(), seen(&p, Some(&running)), now);
    assert!(
        d.warm.status && d.start.is_none(),
        "warm while the check runs"
    );
    let failed = finished(
        key3.clone(),
        Err(Cold::ParityExceeded("x".into())),
        0,
        now,
        (Duration::from_secs(5), Duration::from_secs(60)),
    );
    let d = decide(&p, &newer, served(), seen(&p, Some(&failed)), now);
    assert!(!d.warm.status, "a failed re-check is cold");
    // A restarted server is never warm on an earlier check.
    assert!(
        still_warm(
            Some(&warm),
            &CheckKey {
                restarts: 1,
                ..key3.clone()
            }
        )
        .is_none()
    );
    // Checked again under revision 3, its volume still holds revision 2: warm, and it says so.
    let warm3 = Check::Passed(key3, figures());
    let old_volume = Seen {
        mounted: Some(2),
        ..seen(&p, Some(&warm3))
    };
    let d = decide(&p, &newer, served(), old_volume, now);
    assert!(d.warm.status);
    assert!(
        d.warm.message.contains("volume holds revision 2")
            && d.warm.message.contains("node serves revision 3"),
        "{}",
        d.warm.message
    );
}

#[test]
fn a_failed_check_keeps_its_reason_and_is_retried_after_back_off() {
    let now = Instant::now();
    let p = pod(OIP, true, 0);
    let (_, key) = decide_now(&p, None, now).start.expect("start");
    let backoff = (Duration::from_secs(5), Duration::from_secs(300));
    let wrong = Cold::ParityExceeded("output y: 0.5 > 1e-4".into());
    let c1 = finished(key.clone(), Err(wrong.clone()), 0, now, backoff);
    let d = decide_now(&p, Some(&c1), now);
    assert_eq!(
        (d.warm.status, d.warm.reason.as_str()),
        (false, "ServingParityExceeded")
    );
    assert!(d.warm.message.contains("0.5"));
    assert!(d.start.is_none(), "not before the back-off");
    let later = now + Duration::from_secs(6);
    assert!(decide_now(&p, Some(&c1), later).start.is_some());
    assert_eq!(failures(Some(&c1), &key), 1);
    let c2 = finished(key.clone(), Err(wrong), 1, later, backoff);
    let Check::Cold { retry_at, .. } = c2 else {
        panic!("cold")
    };
    assert_eq!(retry_at, later + Duration::from_secs(10), "doubles");
    let d = decide_now(
        &p,
        Some(&finished(key, Ok(figures()), 2, later, backoff)),
        later,
    );
    assert!(d.warm.status);
}

#[test]
fn annotations_are_checked() {
    let bad = |a: &str| {
        endpoint(&pod(a, true, 0), "sq")
            .expect("annotated")
            .expect_err("refused")
    };
    assert!(bad(r#"{"kiln.dev/protocol": "grpc", "kiln.dev/port": "1"}"#).contains("oip-v2"));
    assert!(bad(r#"{"kiln.dev/protocol": "oip-v2"}"#).contains("kiln.dev/port"));
    assert!(bad(r#"{"kiln.dev/protocol": "oip-v2", "kiln.dev/port": "0"}"#).contains("port"));
    assert!(
        bad(r#"{"kiln.dev/protocol": "oip-v2", "kiln.dev/port": "1", "kiln.dev/model-name": "../x"}"#)
            .contains("model-name")
    );
    assert!(endpoint(&pod(r#"{"kiln.dev/target": "sq"}"#, true, 0), "sq").is_none());
    let p = pod(OIP, true, 0);
    let bad = Seen {
        endpoint: Err("bad".into()),
        check: None,
        mounted: None,
    };
    let d = decide(&p, &row(), served(), bad, Instant::now());
    assert_eq!(
        (d.warm.status, d.warm.reason.as_str()),
        (false, "InvalidSpec")
    );
}

#[test]
fn a_pod_being_deleted_is_never_checked() {
    let mut p = pod(OIP, true, 0);
    let now = Instant::now();
    assert!(
        decide_now(&p, None, now).start.is_some(),
        "a live pod is checked"
    );
    p.metadata.deletion_timestamp =
        Some(serde_json::from_value(serde_json::json!("2026-11-29T11:21:10Z")).expect("time"));
    let d = decide_now(&p, None, now);
    assert!(d.start.is_none(), "a terminating pod started a check");
    assert!(!d.warm.status, "and it is not warm without one");
}
