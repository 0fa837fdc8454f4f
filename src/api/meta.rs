//! The metadata every object of the manifests starts from.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Metadata with the project's name label.
pub(super) fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        labels: Some(
            [(
                "app.kubernetes.io/name".to_string(),
                "shim-agent".to_string(),
            )]
            .into(),
        ),
        ..Default::default()
    }
}
