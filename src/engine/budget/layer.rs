//! The budget as tower middleware around kube's HTTP stack.

use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Request, Response};
use http_body_util::Either;
use kube::client::ClientBuilder;
use kube::client::retry::RetryPolicy;
use tower::buffer::BufferLayer;
use tower::retry::RetryLayer;
use tower::{Layer, Service, ServiceExt};
use tower_http::timeout::TimeoutBody;

use super::{Budget, Verb};

/// Requests queued in front of kube's (single, not clonable) HTTP service; kube's own client
/// uses the same bound.
const BUFFER: usize = 1024;

/// A `kube::Client` whose every request goes through `budget`.
///
/// Stack, outermost first: kube's retry policy (429, 503, 504, honouring Retry-After), the
/// budget, a bound on the wait for each answer ([`ANSWER_TIMEOUT`], watches excepted), a
/// buffer, kube's default HTTP stack. The retry sits outside the budget so that every
/// retried attempt takes a token too; kube's built-in retry (inside the stack, where it would
/// bypass the budget) is turned off. Must be called inside a tokio runtime.
pub fn client(mut config: kube::Config, budget: &Budget) -> Result<kube::Client, kube::Error> {
    config.default_retry = false;
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&BufferLayer::new(BUFFER))
        .with_layer(&tower::layer::layer_fn(|inner| AnswerWithin { inner }))
        .with_layer(&budget.layer())
        .with_layer(&RetryLayer::new(RetryPolicy::server_retry()))
        .build())
}

/// Puts every request through a [`Budget`]; see [`BudgetService`].
#[derive(Clone)]
pub struct BudgetLayer {
    budget: Budget,
}

impl BudgetLayer {
    pub fn new(budget: Budget) -> Self {
        BudgetLayer { budget }
    }
}

impl<S> Layer<S> for BudgetLayer {
    type Service = BudgetService<S>;

    fn layer(&self, inner: S) -> BudgetService<S> {
        BudgetService {
            inner,
            budget: self.budget.clone(),
        }
    }
}

/// Sends each request only after the budget admits it (a worker slot, then a token of the
/// request's bucket), holds the slot until the response headers arrive, reports the outcome to
/// the budget's observer and pauses the bucket when the server answers 429 or 503 with
/// Retry-After.
///
/// The inner service must be `Clone` (put a buffer in front of kube's stack, as [`client`]
/// does): the request waits for the budget in its own future, so each call drives a clone.
#[derive(Clone)]
pub struct BudgetService<S> {
    inner: S,
    budget: Budget,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for BudgetService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<ResBody>, S::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        // Readiness of the inner service is awaited in the call's future, after the budget.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let inner = self.inner.clone();
        let budget = self.budget.clone();
        Box::pin(async move {
            let verb = Verb::of(&request);
            let flow = super::flows::of(request.uri().path()).to_owned();
            let admission = budget.admit(verb, &flow).await;
            let result = inner.oneshot(request).await;
            match &result {
                Ok(response) => {
                    let throttled = budget.obey(verb, &flow, response.status(), response.headers());
                    budget
                        .inner
                        .observer
                        .response(verb, Some(response.status()));
                    admission.finish(throttled, !throttled);
                }
                Err(_) => {
                    budget.inner.observer.response(verb, None);
                    admission.finish(false, false);
                }
            }
            result
        })
    }
}

/// How long a request other than a watch may wait for its answer to begin (its status and
/// headers) once the budget sent it:
/// past the API server's own request timeout (60 s by default, when it answers 504), so only
/// a connection nobody answers on any more (a stalled proxy, a half-open connection to a dead
/// server) ends here, as an error the caller retries, instead of holding its request forever.
/// Watches stay open by design; kube's watcher bounds their silence itself.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(90);

/// Bounds each non-watch answer by [`ANSWER_TIMEOUT`]: the wait for its status and headers,
/// and then each silence in its body (a list whose connection stalls after its first bytes).
/// kube's `read_timeout`, a bound on the connection, would cut idle watches too, so the client
/// sets none and this layer bounds the rest.
#[derive(Clone)]
pub struct AnswerWithin<S> {
    pub(super) inner: S,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for AnswerWithin<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>, Error = tower::BoxError>,
    S::Future: Send + 'static,
{
    type Response = Response<Either<TimeoutBody<ResBody>, ResBody>>;
    type Error = tower::BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, tower::BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let watch = Verb::of(&request) == Verb::Watch;
        let answer = self.inner.call(request);
        Box::pin(async move {
            if watch {
                return Ok(answer.await?.map(Either::Right));
            }
            match tokio::time::timeout(ANSWER_TIMEOUT, answer).await {
                Ok(answer) => {
                    Ok(answer?.map(|body| Either::Left(TimeoutBody::new(ANSWER_TIMEOUT, body))))
                }
                Err(elapsed) => Err(Box::new(elapsed) as tower::BoxError),
            }
        })
    }
}
