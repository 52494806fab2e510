//! A tenant's jobs as one `JobView` each: list, show, wait, cancel.

use super::*;

impl Scoped {
    /// Wait until job `id` ends or `limit` passes; the job as it then stands.
    pub async fn wait_job(&self, id: u64, limit: Duration) -> AppResult<Option<Job>> {
        let mut live = self
            .app
            .inner
            .events
            .subscribe(&self.tenant, None)
            .await
            .live;
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let j = self.app.inner.jobs.get(id).await?;
            match &j {
                Some(j) if j.state.is_active() => {}
                _ => return Ok(j),
            }
            let step = tokio::time::sleep_until(
                deadline.min(tokio::time::Instant::now() + Duration::from_millis(250)),
            );
            tokio::select! {
                _ = live.recv() => {}
                _ = step => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return self.app.inner.jobs.get(id).await.map_err(Into::into);
            }
        }
    }

    /// The tenant's newest jobs (ids below `before`), newest first.
    pub async fn list_jobs(&self, before: Option<u64>, limit: u32) -> AppResult<Vec<JobView>> {
        Ok(self
            .app
            .inner
            .jobs
            .list_for(&*self.tables, before, limit)
            .await?
            .iter()
            .map(|j| self.job_view(j))
            .collect())
    }

    /// The tenant's jobs a worker could take now, oldest first: queued ones, and running
    /// ones whose worker is gone (after a crash or kill).
    pub async fn runnable_jobs(&self) -> AppResult<Vec<JobView>> {
        Ok(self
            .app
            .inner
            .jobs
            .runnable(None)
            .await?
            .iter()
            .filter(|j| j.tenant == self.tenant)
            .map(|j| self.job_view(j))
            .collect())
    }

    /// One of the tenant's jobs (another tenant's is not found).
    pub async fn job(&self, id: u64) -> AppResult<JobView> {
        self.own_job(id).await.map(|j| self.job_view(&j))
    }

    pub(crate) async fn own_job(&self, id: u64) -> AppResult<Job> {
        self.app
            .inner
            .jobs
            .get(id)
            .await?
            .filter(|j| j.tenant == self.tenant)
            .ok_or_else(|| AppError::not_found(format!("no job {id}")))
    }

    /// Cancel a job: a queued one at once, a running one within a second.
    pub async fn cancel_job(&self, id: u64) -> AppResult<JobView> {
        let job = self.own_job(id).await?;
        if !job.state.is_active() {
            return Err(AppError::new(
                ErrorKind::Conflict,
                format!("job {id} already {}", job.state.as_str()),
            ));
        }
        let now = self
            .app
            .inner
            .jobs
            .cancel(id)
            .await?
            .ok_or_else(|| AppError::not_found(format!("no job {id}")))?;
        if now.state == crate::jobs::JobState::Cancelled {
            self.publish(What::cancelled(), Some(now.session.as_str()), Some(id));
        }
        Ok(self.job_view(&now))
    }

    /// A job as callers see it (the session id without the tenant).
    pub fn job_view(&self, j: &Job) -> JobView {
        JobView::from(j)
    }
}
