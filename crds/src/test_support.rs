//! What unit tests of several modules share.

/// `name` gives the serde name of every variant in `all`, and that name reads back as it.
pub fn serde_names<T>(all: &[T], name: fn(&T) -> &'static str)
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    for v in all {
        let json = serde_json::to_value(v).expect("serialise");
        assert_eq!(json, serde_json::json!(name(v)));
        assert_eq!(&serde_json::from_value::<T>(json).expect("read"), v);
    }
}
