//! The port bound before the models load: it answers 503 on every route until `finish` hands it to the real server.

use std::io;
use std::net::{TcpListener, ToSocketAddrs};
use std::thread::JoinHandle;

use actix_web::body::MessageBody;
use actix_web::dev::{ServerHandle, ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::http::KeepAlive;
use actix_web::{web, App, HttpResponse, HttpServer};

use super::error::ApiError;

/// Bound sockets served by a small loading server on its own thread.
pub struct Starting {
    listeners: Vec<TcpListener>,
    handle: ServerHandle,
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl Starting {
    /// Binds every address `host:port` resolves to, prints `listening on http://ADDR` for each, and answers 503.
    pub fn bind(host: &str, port: u16) -> io::Result<Starting> {
        let mut listeners = Vec::new();
        for addr in (host, port).to_socket_addrs()? {
            let listener = TcpListener::bind(addr)?;
            eprintln!("listening on http://{}", listener.local_addr()?);
            listeners.push(listener);
        }
        if listeners.is_empty() {
            return Err(io::Error::new(io::ErrorKind::AddrNotAvailable, format!("{host} resolves to no address")));
        }
        let copies = listeners.iter().map(TcpListener::try_clone).collect::<io::Result<Vec<_>>>()?;
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new().name("tf-loading-http".into()).spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                // Without keep-alive the graceful stop has no idle connection to wait for.
                let mut server = HttpServer::new(loading_app)
                    .workers(1)
                    .keep_alive(KeepAlive::Disabled)
                    .shutdown_timeout(1)
                    .disable_signals();
                for listener in copies {
                    server = server.listen(listener)?;
                }
                let server = server.run();
                let _ = handle_tx.send(server.handle());
                server.await
            })
        })?;
        match handle_rx.recv() {
            Ok(handle) => Ok(Starting { listeners, handle, thread: Some(thread) }),
            Err(_) => Err(thread
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the loading server panicked")))
                .err()
                .unwrap_or_else(|| io::Error::other("the loading server stopped before it started"))),
        }
    }

    /// Stops the loading server and gives back the sockets; connections arriving meanwhile wait in the backlog.
    pub async fn finish(mut self) -> io::Result<Vec<TcpListener>> {
        self.handle.stop(true).await;
        self.join()?;
        Ok(std::mem::take(&mut self.listeners))
    }

    fn join(&mut self) -> io::Result<()> {
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(io::Error::other("the loading server panicked")),
            None => Ok(()),
        }
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        if self.thread.is_some() {
            // Sent at once; the returned future only waits for the stop.
            drop(self.handle.stop(false));
            let _ = self.join();
        }
    }
}

/// What the port answers while the models load: `/health` as `{"status": "loading"}`, anything else an API error.
pub fn loading_app() -> App<
    impl ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<impl MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    App::new()
        .route(
            "/health",
            web::get()
                .to(|| async { HttpResponse::ServiceUnavailable().json(serde_json::json!({"status": "loading"})) }),
        )
        .default_service(web::to(|| async { Err::<HttpResponse, _>(ApiError::Loading) }))
}
