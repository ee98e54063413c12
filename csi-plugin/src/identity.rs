//! Who the plugin is: the CSI Identity service, and the kubelet's plugin registration API
//! (`pluginregistration.Registration`), which kiln serves itself instead of running the
//! node-driver-registrar image beside it.

use std::path::PathBuf;

use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use super::proto::csi::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, ProbeRequest, ProbeResponse, identity_server,
};
use super::proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse, registration_server,
};

/// The driver's name: the `CSIDriver` object's and every pod volume's `driver`.
pub const DRIVER: &str = "csi.kiln.dev";

/// The CSI versions the plugin speaks, as the kubelet asks them.
pub const SUPPORTED_VERSIONS: [&str; 1] = ["1.0.0"];

/// The Identity service.
pub struct Identity;

#[tonic::async_trait]
impl identity_server::Identity for Identity {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: DRIVER.into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        // A node-only plugin: no controller service, no topology.
        Ok(Response::new(GetPluginCapabilitiesResponse::default()))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

/// The registration service: tells the kubelet where the CSI socket is, and passes on a failed
/// registration (the process then exits non-zero so that its container restarts and tries
/// again).
pub struct Registration {
    /// The CSI socket as the kubelet sees it.
    pub endpoint: PathBuf,
    /// Where a failed registration's message goes.
    pub failed: mpsc::Sender<String>,
}

#[tonic::async_trait]
impl registration_server::Registration for Registration {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: "CSIPlugin".into(),
            name: DRIVER.into(),
            endpoint: self.endpoint.display().to_string(),
            supported_versions: SUPPORTED_VERSIONS.map(String::from).to_vec(),
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = req.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = DRIVER, endpoint = %self.endpoint.display(), "registered with the kubelet");
        } else {
            tracing::error!(driver = DRIVER, error = %status.error, "the kubelet refused the registration");
            let _ = self.failed.try_send(status.error);
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
