//! The NNEF dialect of tract artifacts: which operator registries write a compiled profile and
//! read it back. Compile and load take it from here, so what one writes the other can read.
//! Pure: builds registries, touches no file.

use tract_nnef::internal::Registry;
use tract_nnef::tract_core::ops::nn::GeluExact;
use tract_onnx_opl::WithOnnx;
use tract_transformers::WithTractTransformers;

/// The `tract_registry` extension holding kiln's own operator names.
const KILN_REGISTRY: &str = "kiln";

/// tract's core and ONNX operators, its transformer operators (attention, RMS norm, rotary
/// embeddings, which tract fuses transformer graphs into) and [`kiln_registry`].
pub fn framework() -> tract_nnef::framework::Nnef {
    tract_nnef::nnef()
        .with_onnx()
        .with_tract_transformers()
        .with_registry(kiln_registry())
}

/// Operators tract builds while optimising but ships no NNEF name for. tract 0.23.9 fuses the
/// exact GELU `0.5·x·(1+erf(x/√2))` of BERT-style encoders into `GeluExact` and then cannot
/// write it; here it is written as the element-wise `kiln_gelu_exact(x)` and read back as the
/// same operator.
fn kiln_registry() -> Registry {
    let mut registry = Registry::new(KILN_REGISTRY)
        .with_doc("Extension `kiln`: tract operators without an NNEF serializer of their own.");
    registry.register_unit_element_wise("kiln_gelu_exact", &GeluExact {});
    registry
}

#[cfg(test)]
mod tests {
    use super::*;
    use tract_nnef::internal::*;
    use tract_nnef::tract_core::ops::nn::gelu_exact::gelu_exact;

    #[test]
    fn gelu_exact_is_written_and_read_back_as_itself() -> TractResult<()> {
        let mut model = TypedModel::default();
        let x = model.add_source("x", f32::fact([5]))?;
        let y = model.wire_node("gelu", gelu_exact(), &[x])?;
        model.select_output_outlets(&y)?;
        let nnef = framework();
        let mut tar = Vec::new();
        nnef.write_to_tar(&model, &mut tar)?;
        let read = nnef.model_for_read(&mut tar.as_slice())?;
        let gelu = read
            .nodes()
            .iter()
            .find(|n| n.op().name() == "GeluExact")
            .map(|n| n.name.clone());
        assert!(gelu.is_some(), "{read}");
        let input = tensor1(&[-2f32, -0.5, 0.0, 0.5, 2.0]);
        let out = read.into_runnable()?.run(tvec!(input.into()))?;
        let want = [-0.0455f32, -0.1543, 0.0, 0.3457, 1.9545];
        for (got, want) in out[0].to_plain_array_view::<f32>()?.iter().zip(want) {
            assert!((got - want).abs() < 1e-4, "{got} against {want}");
        }
        Ok(())
    }
}
