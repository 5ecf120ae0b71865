//! The server, started before the models load: it answers 503 until `serve` hands it the loaded state.

use std::io;
use std::net::{TcpListener, ToSocketAddrs};
use std::thread::JoinHandle;

use actix_web::HttpServer;
use tokio::sync::oneshot;

use super::routes::{app_over, Slot};
use super::{AppState, ServeConfig};

/// How long an idle connection stays open: longer than routers' and proxies' pools keep theirs (90 s for
/// reqwest's), so a pooled connection is never closed under the request sent on it.
const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(120);

/// The running HTTP server, on its own thread, and the slot its handlers wait on.
pub struct Starting {
    slot: Slot<tensorfold_actors::runtime::Runtime>,
    stopped: oneshot::Receiver<io::Result<()>>,
    thread: JoinHandle<()>,
}

impl Starting {
    /// Binds every address the host resolves to, prints `listening on http://ADDR` for each, and starts serving.
    pub fn bind(config: &ServeConfig) -> io::Result<Starting> {
        let mut listeners = Vec::new();
        for addr in (config.host.as_str(), config.port).to_socket_addrs()? {
            let listener = TcpListener::bind(addr)?;
            eprintln!("listening on http://{}", listener.local_addr()?);
            listeners.push(listener);
        }
        if listeners.is_empty() {
            let why = format!("{} resolves to no address", config.host);
            return Err(io::Error::new(io::ErrorKind::AddrNotAvailable, why));
        }
        let slot = Slot::default();
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (stopped_tx, stopped) = oneshot::channel();
        let (app_slot, api_key, max_body_bytes) = (slot.clone(), config.api_key.clone(), config.max_body_bytes);
        let thread = std::thread::Builder::new().name("tf-http".into()).spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let server = HttpServer::new(move || app_over(app_slot.clone(), api_key.clone(), max_body_bytes))
                    .keep_alive(KEEP_ALIVE);
                let server = listeners.into_iter().try_fold(server, HttpServer::listen);
                let server = match server {
                    Ok(server) => server.run(),
                    Err(e) => return drop(started_tx.send(Err(e))),
                };
                let _ = started_tx.send(Ok(()));
                let _ = stopped_tx.send(server.await);
            })
        })?;
        started_rx.recv().unwrap_or_else(|_| Err(io::Error::other("the HTTP server's thread ended")))?;
        Ok(Starting { slot, stopped, thread })
    }

    /// Hands the loaded state to the handlers, so `/health` turns 200, and serves until the server stops.
    pub async fn serve(self, state: AppState) -> io::Result<()> {
        if self.slot.set(actix_web::web::Data::new(state)).is_err() {
            return Err(io::Error::other("the server was handed its state twice"));
        }
        tracing::info!("every model is loaded; serving");
        let result = self.stopped.await.unwrap_or_else(|_| Err(io::Error::other("the HTTP server's thread ended")));
        let _ = self.thread.join();
        result
    }
}
