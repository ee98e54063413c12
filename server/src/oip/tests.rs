use super::*;

fn tensor(dtype: Dtype, shape: &[usize], data: Vec<u8>) -> HostTensor {
    HostTensor {
        dtype,
        shape: shape.to_vec(),
        data,
    }
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn every_served_dtype_round_trips_through_json_and_binary() {
    let cases = [
        tensor(Dtype::F32, &[2, 2], f32s(&[1.5, -2.25, 3.0, 0.1])),
        tensor(Dtype::F64, &[1], (-7.5f64).to_le_bytes().to_vec()),
        tensor(
            Dtype::F16,
            &[2],
            [0x3c00u16, 0xc000]
                .iter()
                .flat_map(|b| b.to_le_bytes())
                .collect(),
        ),
        tensor(
            Dtype::I64,
            &[2],
            [i64::MIN, 42]
                .iter()
                .flat_map(|b| b.to_le_bytes())
                .collect(),
        ),
        tensor(
            Dtype::I32,
            &[1, 3],
            [1i32, -1, 7].iter().flat_map(|b| b.to_le_bytes()).collect(),
        ),
        tensor(Dtype::I8, &[2], vec![0x80, 0x7f]),
        tensor(Dtype::U8, &[3], vec![0, 128, 255]),
        tensor(Dtype::BOOL, &[2], vec![1, 0]),
    ];
    for t in cases {
        let json = from_host("x", &t).expect("to wire");
        assert_eq!(json.datatype, datatype(t.dtype).expect("named"));
        // Through serde too, as a body would travel.
        let wire: WireTensor =
            serde_json::from_slice(&serde_json::to_vec(&json).expect("json")).expect("parse");
        assert_eq!(to_host(&wire, None).expect("from json"), t, "{:?}", t.dtype);
        let bin = from_host_binary("x", &t).expect("binary");
        assert_eq!(to_host(&bin, Some(&t.data)).expect("from binary"), t);
    }
}

#[test]
fn nested_data_is_row_major_and_values_must_fit() {
    let wire = WireTensor {
        name: "a".into(),
        shape: vec![2, 2],
        datatype: "INT8".into(),
        data: Some(serde_json::json!([[1, 2], [3, -4]])),
        ..WireTensor::default()
    };
    assert_eq!(
        to_host(&wire, None).expect("nested").data,
        vec![1, 2, 3, 0xfc]
    );
    let refused = |data: Value, shape: Vec<i64>, datatype: &str| {
        to_host(
            &WireTensor {
                name: "a".into(),
                shape,
                datatype: datatype.into(),
                data: Some(data),
                ..WireTensor::default()
            },
            None,
        )
        .expect_err("refused")
    };
    assert!(refused(serde_json::json!([300]), vec![1], "INT8").contains("does not fit"));
    assert!(refused(serde_json::json!([1.5]), vec![1], "INT32").contains("not an integer"));
    assert!(refused(serde_json::json!([1, 2, 3]), vec![2], "FP32").contains("more than"));
    assert!(refused(serde_json::json!([1]), vec![2], "FP32").contains("1 elements"));
    assert!(refused(serde_json::json!(["x"]), vec![1], "FP32").contains("not a number"));
    assert!(refused(serde_json::json!([1]), vec![-1], "FP32").contains("negative"));
    assert!(refused(serde_json::json!([1]), vec![1], "BYTES").contains("not one kiln serves"));
    let huge = refused(serde_json::json!([]), vec![1 << 20, 1 << 20], "FP32");
    assert!(huge.contains("more than"), "{huge}");
    let overflow = refused(serde_json::json!([]), vec![i64::MAX, i64::MAX], "FP32");
    assert!(overflow.contains("more than"), "{overflow}");
}

#[test]
fn binary_parts_are_taken_in_order_and_must_add_up() {
    let a = tensor(Dtype::F32, &[2], f32s(&[1.0, 2.0]));
    let b = tensor(Dtype::I64, &[1], 9i64.to_le_bytes().to_vec());
    let request = InferRequest {
        inputs: vec![
            from_host_binary("a", &a).expect("a"),
            from_host("b", &b).expect("b"),
        ],
        ..InferRequest::default()
    };
    let got = binary::request_inputs(&request, &a.data).expect("inputs");
    assert_eq!((got["a"].clone(), got["b"].clone()), (a.clone(), b));
    let short = binary::request_inputs(&request, &a.data[..4]).expect_err("short");
    assert!(short.contains("runs past"), "{short}");
    let mut long = a.data.clone();
    long.push(0);
    assert!(
        binary::request_inputs(&request, &long)
            .expect_err("extra")
            .contains("add up")
    );
    let twice = InferRequest {
        inputs: vec![
            from_host("a", &a).expect("a"),
            from_host("a", &a).expect("a"),
        ],
        ..InferRequest::default()
    };
    assert!(
        binary::request_inputs(&twice, &[])
            .expect_err("twice")
            .contains("twice")
    );
}

#[test]
fn a_body_splits_at_its_header_length_and_a_response_joins_back() {
    let (json, tail) = binary::split(b"{}abcd", Some("2")).expect("split");
    assert_eq!((json, tail), (&b"{}"[..], &b"abcd"[..]));
    assert_eq!(
        binary::split(b"{}", None).expect("plain"),
        (&b"{}"[..], &b""[..])
    );
    assert!(binary::split(b"{}", Some("9")).is_err());
    assert!(binary::split(b"{}", Some("-1")).is_err());
    let out = tensor(Dtype::F32, &[2], f32s(&[0.5, 0.25]));
    let response = InferResponse {
        model_name: "m".into(),
        outputs: vec![
            from_host_binary("y", &out).expect("y"),
            from_host("z", &out).expect("z"),
        ],
        ..InferResponse::default()
    };
    let (body, header) = binary::join(&response, std::slice::from_ref(&out.data));
    let (json, tail) =
        binary::split(&body, Some(&header.expect("binary").to_string())).expect("split");
    let parsed: InferResponse = serde_json::from_slice(json).expect("json");
    let outputs = binary::response_outputs(&parsed, tail).expect("outputs");
    assert_eq!(
        (outputs["y"].clone(), outputs["z"].clone()),
        (out.clone(), out)
    );
}

#[test]
fn binary_is_asked_per_output_or_for_all() {
    let mut request = InferRequest::default();
    assert!(!wants_binary(&request, "y"));
    request
        .parameters
        .insert("binary_data_output".into(), Value::Bool(true));
    assert!(wants_binary(&request, "y"));
    let mut no = Map::new();
    no.insert("binary_data".into(), Value::Bool(false));
    request.outputs = Some(vec![RequestedOutput {
        name: "y".into(),
        parameters: no,
    }]);
    assert!(!wants_binary(&request, "y"), "the output's own flag wins");
}

#[test]
fn kserve_bodies_with_null_optional_fields_are_read() {
    // As KServe's ModelServer 0.21.0 answers (e2e/testdata/kserve_onnx.py).
    let meta: ModelMetadata = serde_json::from_str(
        r#"{"name":"sq","versions":null,"platform":"","inputs":[{"name":"data_0","datatype":"FP32","shape":[-1,3]}],"outputs":null}"#,
    )
    .expect("metadata with null versions and outputs");
    assert!(meta.versions.is_empty() && meta.outputs.is_empty());
    assert_eq!(meta.inputs[0].name, "data_0");
    let answer: InferResponse = serde_json::from_str(
        r#"{"model_name":"sq","model_version":null,"id":"","parameters":null,"outputs":[{"name":"y","shape":[2],"datatype":"FP32","parameters":null,"data":[1.0,2.5]}]}"#,
    )
    .expect("a response with null parameters");
    let outputs = binary::response_outputs(&answer, &[]).expect("outputs");
    assert_eq!(outputs["y"].shape, vec![2]);
    // A present field of the wrong type is still refused.
    serde_json::from_str::<ModelMetadata>(r#"{"name":"sq","versions":7,"platform":""}"#)
        .expect_err("versions must be a list");
}
